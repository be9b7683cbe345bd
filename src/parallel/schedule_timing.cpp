#include "parallel/schedule_timing.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

#include "core/format.hpp"

namespace mpiformer {

double SimulatedStep::idle_fraction() const {
  double busy = 0;
  for (double c : compute) busy += c;
  const double total = step_time * static_cast<double>(compute.size());
  return total > 0 ? 1.0 - busy / total : 0.0;
}

SimulatedStep simulate_step(ScheduleKind kind, int num_stages, int num_micro,
                            const ActionCosts& costs, int chunks, bool keep_timeline) {
  const auto n = static_cast<size_t>(num_stages), nv = n * static_cast<size_t>(chunks);
  if (costs.forward.size() != nv || costs.backward.size() != nv || costs.reduce.size() != n ||
      (!costs.weights.empty() && costs.weights.size() != nv)) {
    throw std::invalid_argument("simulate_step: costs for " + std::to_string(num_stages) +
                                " stages of " + std::to_string(chunks) + " chunk(s) expected");
  }
  const auto schedules = pipeline_schedules(kind, num_stages, num_micro, chunks);
  const std::vector<std::vector<Action>>& lists = *schedules;
  SimulatedStep out;
  out.compute.assign(n, 0.0);
  out.waiting.assign(n, 0.0);
  out.timeline.assign(keep_timeline ? n : 0, {});
  for (size_t s = 0; s < out.timeline.size(); ++s) out.timeline[s].reserve(lists[s].size());
  // When each message arrives (-1: not sent yet), by receiving stage,
  // chunk, kind (activation, gradient) and micro-batch: a flat table, not
  // a map (the planner simulates tens of thousands of steps).
  const size_t micro = static_cast<size_t>(std::max(num_micro, 0));
  std::vector<double> arrivals(nv * 2 * micro, -1.0);
  const auto arrival = [&](int stage, int chunk, Op op, int mb) -> double& {
    const size_t kind = op == Op::RecvActivation ? 0 : 1;
    const size_t at = ((static_cast<size_t>(stage) * static_cast<size_t>(chunks) + static_cast<size_t>(chunk)) * 2 + kind) * micro +
                      static_cast<size_t>(mb);
    if (chunk < 0 || chunk >= chunks || mb < 0 || static_cast<size_t>(mb) >= micro)
      throw std::logic_error(strprintf("simulate_step: a message for micro-batch %d, chunk %d", mb, chunk));
    return arrivals[at];
  };
  std::vector<size_t> next(n, 0);
  std::vector<double> clock(n, 0.0);
  const bool split = splits_backward(kind);
  const auto weights = [&](size_t vs) { return costs.weights.empty() ? 0.0 : costs.weights[vs]; };
  const auto cost = [&](int s, const Action& a) {
    const size_t vs = static_cast<size_t>(a.chunk) * n + static_cast<size_t>(s);
    switch (a.op) {
      case Op::Forward: return costs.forward[vs];
      case Op::Backward: return costs.backward[vs] + (split ? 0.0 : weights(vs));
      case Op::WeightGradients: return weights(vs);
      case Op::ReduceGradients: return costs.reduce[s];
      default: return 0.0;  // sends start at once; receives wait, then cost nothing more
    }
  };
  // Every stage runs until a receive whose message has not been sent yet,
  // or its optimizer step (a barrier); round after round until none moves.
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < num_stages; ++s) {
      while (next[s] < lists[s].size()) {
        const Action a = lists[s][next[s]];
        if (a.op == Op::OptimizerStep) break;
        double start = clock[s];
        if (a.op == Op::RecvActivation || a.op == Op::RecvGradient) {
          const double at = arrival(s, a.chunk, a.op, a.micro);
          if (at < 0) break;
          out.waiting[s] += std::max(0.0, at - start);
          start = std::max(start, at);
        }
        const double end = start + cost(s, a);
        if (a.op == Op::SendActivation) {
          const PipePeer to = activation_to(num_stages, s, a.chunk);
          arrival(to.stage, to.chunk, Op::RecvActivation, a.micro) = start + costs.p2p;
        }
        if (a.op == Op::SendGradient) {
          const PipePeer to = gradient_to(num_stages, s, a.chunk);
          arrival(to.stage, to.chunk, Op::RecvGradient, a.micro) = start + costs.p2p;
        }
        if (a.op == Op::Forward || a.op == Op::Backward || a.op == Op::WeightGradients)
          out.compute[s] += end - start;
        if (keep_timeline) out.timeline[s].push_back({a, start, end});
        clock[s] = end;
        ++next[s];
        moved = true;
      }
    }
  }
  const double barrier = *std::max_element(clock.begin(), clock.end());
  for (int s = 0; s < num_stages; ++s) {
    if (next[s] + 1 != lists[s].size() || lists[s][next[s]].op != Op::OptimizerStep) {
      throw std::logic_error(strprintf("simulate_step: stage %d cannot finish the schedule", s));
    }
    out.waiting[s] += barrier - clock[s];
    if (keep_timeline) out.timeline[s].push_back({lists[s][next[s]], barrier, barrier + costs.optimizer});
  }
  out.step_time = barrier + costs.optimizer;
  return out;
}

std::string timeline_trace(const SimulatedStep& step) {
  std::string j = "[";
  for (size_t s = 0; s < step.timeline.size(); ++s) {
    j += strprintf("%s\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %zu, \"args\": "
                   "{\"name\": \"stage %zu (predicted)\"}}",
                   s == 0 ? "" : ",", s, s);
    for (const TimedAction& t : step.timeline[s]) {
      if (t.end <= t.start) continue;
      j += strprintf(",\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %zu, \"tid\": 0, \"ts\": %.3f, "
                     "\"dur\": %.3f, \"args\": {\"micro_batch\": %d, \"chunk\": %d}}",
                     op_name(t.action.op), s, 1e6 * t.start, 1e6 * (t.end - t.start),
                     t.action.micro, t.action.chunk);
    }
  }
  return j + "\n]\n";
}

}  // namespace mpiformer
