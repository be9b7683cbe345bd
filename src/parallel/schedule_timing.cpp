#include "parallel/schedule_timing.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "core/bounded_memo.hpp"
#include "core/format.hpp"

namespace mpiformer {

double SimulatedStep::idle_fraction() const {
  double busy = 0;
  for (double c : compute) busy += c;
  const double total = step_time * static_cast<double>(compute.size());
  return total > 0 ? 1.0 - busy / total : 0.0;
}

namespace {

// A pipeline's schedule compiled for simulation: for each action, where its
// cost is in a flat table (so that one branch-free lookup prices it), and
// the message slot it reads (a receive) or writes (a send). Compiled once
// per pipeline and remembered: a layout search simulates each pipeline
// with many layouts' costs, up to 2.7 million actions a step.
struct CompiledStep {
  enum Kind : int32_t { kRun, kCompute, kRecv, kSend, kStop };
  int32_t kind = kRun;
  int32_t cost = 0;  // index in the cost table (0: costs nothing)
  int64_t message = 0;  // a receive's or send's slot; a computation's micro-batch
};
struct CompiledSchedule {
  std::vector<std::vector<CompiledStep>> stages;
  // Per stage: how many of its actions cost each entry of the table.
  std::vector<std::vector<std::pair<int32_t, int64_t>>> work;
  size_t messages = 0;
};

// The cost table's layout: 0, then forward, backward, weight gradients by
// (chunk, stage), then each stage's reduction.
size_t forward_at(size_t /*nv*/, size_t vs) { return 1 + vs; }
size_t backward_at(size_t nv, size_t vs) { return 1 + nv + vs; }
size_t weights_at(size_t nv, size_t vs) { return 1 + 2 * nv + vs; }
size_t reduce_at(size_t nv, size_t s) { return 1 + 3 * nv + s; }

std::shared_ptr<const CompiledSchedule> compiled_schedule(ScheduleKind kind, int num_stages,
                                                          int num_micro, int chunks) {
  static BoundedMemo<std::tuple<ScheduleKind, int, int, int>, CompiledSchedule> known(
      std::numeric_limits<size_t>::max(), 64.0 * (1 << 20));
  const auto make = [&] {
    const auto lists = pipeline_schedules(kind, num_stages, num_micro, chunks);
    const auto n = static_cast<size_t>(num_stages), nv = n * static_cast<size_t>(chunks);
    const size_t micro = static_cast<size_t>(std::max(num_micro, 0));
    // When each message arrives, by receiving stage, chunk, kind
    // (activation, gradient) and micro-batch.
    const auto slot = [&](int stage, int chunk, Op op, int mb) -> int64_t {
      if (chunk < 0 || chunk >= chunks || mb < 0 || static_cast<size_t>(mb) >= micro)
        throw std::logic_error(
            strprintf("simulate_step: a message for micro-batch %d, chunk %d", mb, chunk));
      const size_t kind_of = op == Op::RecvActivation ? 0 : 1;
      return static_cast<int64_t>(
          ((static_cast<size_t>(stage) * static_cast<size_t>(chunks) + static_cast<size_t>(chunk)) * 2 +
           kind_of) * micro + static_cast<size_t>(mb));
    };
    auto out = std::make_shared<CompiledSchedule>();
    out->messages = nv * 2 * micro;
    out->stages.resize(n);
    for (int s = 0; s < num_stages; ++s) {
      auto& steps = out->stages[static_cast<size_t>(s)];
      steps.reserve((*lists)[static_cast<size_t>(s)].size());
      for (const Action& a : (*lists)[static_cast<size_t>(s)]) {
        const size_t vs = static_cast<size_t>(a.chunk) * n + static_cast<size_t>(s);
        CompiledStep c;
        switch (a.op) {
          case Op::Forward:
            c = {CompiledStep::kCompute, static_cast<int32_t>(forward_at(nv, vs)), a.micro};
            break;
          case Op::Backward:
            c = {CompiledStep::kCompute, static_cast<int32_t>(backward_at(nv, vs)), a.micro};
            break;
          case Op::WeightGradients:
            c = {CompiledStep::kCompute, static_cast<int32_t>(weights_at(nv, vs)), a.micro};
            break;
          case Op::ReduceGradients:
            c = {CompiledStep::kRun, static_cast<int32_t>(reduce_at(nv, static_cast<size_t>(s))), 0};
            break;
          case Op::RecvActivation:
          case Op::RecvGradient:
            c = {CompiledStep::kRecv, 0, slot(s, a.chunk, a.op, a.micro)};
            break;
          case Op::SendActivation: {
            const PipePeer to = activation_to(num_stages, s, a.chunk);
            c = {CompiledStep::kSend, 0, slot(to.stage, to.chunk, Op::RecvActivation, a.micro)};
            break;
          }
          case Op::SendGradient: {
            const PipePeer to = gradient_to(num_stages, s, a.chunk);
            c = {CompiledStep::kSend, 0, slot(to.stage, to.chunk, Op::RecvGradient, a.micro)};
            break;
          }
          case Op::OptimizerStep: c = {CompiledStep::kStop, 0, 0}; break;
          default: break;  // costs nothing
        }
        steps.push_back(c);
      }
      std::map<int32_t, int64_t> uses;
      for (const CompiledStep& c : steps)
        if (c.cost != 0) ++uses[c.cost];
      out->work.emplace_back(uses.begin(), uses.end());
    }
    return std::shared_ptr<const CompiledSchedule>(std::move(out));
  };
  return known.get(std::make_tuple(kind, num_stages, num_micro, chunks), make,
                   [](const CompiledSchedule& c) {
                     double bytes = 0;
                     for (const auto& steps : c.stages)
                       bytes += static_cast<double>(steps.size() * sizeof(CompiledStep));
                     return bytes;
                   });
}

// Each action's cost by its place in the table (compiled_schedule).
std::vector<double> cost_table(ScheduleKind kind, size_t n, size_t nv, const ActionCosts& costs) {
  // Split backward (zb-h1) prices the weight gradients apart; otherwise
  // the backward carries them.
  const bool split = splits_backward(kind);
  std::vector<double> table(1 + 3 * nv + n, 0.0);
  for (size_t vs = 0; vs < nv; ++vs) {
    const double w = costs.weights.empty() ? 0.0 : costs.weights[vs];
    table[forward_at(nv, vs)] = costs.forward[vs];
    table[backward_at(nv, vs)] = costs.backward[vs] + (split ? 0.0 : w);
    table[weights_at(nv, vs)] = w;
  }
  for (size_t s = 0; s < n; ++s) table[reduce_at(nv, s)] = costs.reduce[s];
  return table;
}

void require_costs_cover(int num_stages, int chunks, const ActionCosts& costs) {
  const auto n = static_cast<size_t>(num_stages), nv = n * static_cast<size_t>(chunks);
  if (costs.forward.size() != nv || costs.backward.size() != nv || costs.reduce.size() != n ||
      (!costs.weights.empty() && costs.weights.size() != nv) ||
      (!costs.block_transfers.empty() && costs.block_transfers.size() != nv) ||
      (!costs.published.empty() && costs.published.size() != n) ||
      (!costs.reduced.empty() && costs.reduced.size() != n)) {
    throw std::invalid_argument("simulate_step: costs for " + std::to_string(num_stages) +
                                " stages of " + std::to_string(chunks) + " chunk(s) expected");
  }
}

// A stage's data-parallel stream (ActionCosts::block_transfers): when it
// is next idle, when each gradient window is next free and which one the
// next block takes, which block each weight window holds and when its
// gather ends.
struct ShardStream {
  double idle = 0;
  double grad_free[2] = {0, 0};
  int turn = 0;
  int64_t holds[2] = {-1, -1};
  double gathered[2] = {0, 0};
  double waited = 0;
  // The all-gathers after AdamW, queued at the step's start: when the
  // embedding's end, then block i's (i + 1 blocks later), then the head's.
  double published_embedding = 0, published_block = 0, published_head = 0;

  // Queues the all-gathers after AdamW of a stage of `blocks` blocks.
  void publish(const ActionCosts::Outside& outside, double per_block, int64_t blocks) {
    published_embedding = outside.embedding;
    published_block = per_block;
    published_head = outside.embedding + per_block * static_cast<double>(blocks) + outside.head;
    idle = published_head;
  }

  // What a pass issues or waits for beside its blocks' computation.
  struct Pass {
    bool forward = false;        // from the first block, else from the last
    bool gathers = false;        // zero 3's block gathers
    bool reduces = false;        // each block's reduce-scatter through the windows
    bool final_reduces = false;  // each block's reduction, no window (zero 0-1's last)
    bool head = false;           // a forward through the head: waits for its weights
    double reduce_first = 0;     // a reduction issued after the pass's lead (the head's backward)
    double reduce_last = 0;      // and one after its tail (the embedding's)
  };
  // A pass (`kind`: 0 forward, 1 backward, 2 W) of `seconds` from `start`
  // over the chunk's blocks. Returns its end.
  double pass(const ActionCosts::BlockTransfers& b, int kind, double start, double seconds,
              const Pass& p) {
    const auto at = static_cast<size_t>(kind);
    const double lead = std::min(b.lead[at], seconds);
    const double tail = std::min(b.tail[at], seconds - lead);
    const double per_block = (seconds - lead - tail) / static_cast<double>(b.blocks);
    double t = start;
    const auto issue = [&](double transfer) {
      if (transfer > 0) idle = std::max(idle, t) + transfer;
    };
    const auto wait = [&](double until) {
      if (until > t) {
        waited += until - t;
        t = until;
      }
    };
    // The embedding computes once its weights are in; the head's
    // gradients are reduced once its backward is done.
    if (p.forward && lead > 0) wait(published_embedding);
    t += lead;
    issue(p.reduce_first);
    const auto gather = [&](int64_t i) {
      if (holds[i % 2] == i) return;
      idle = std::max(idle, t) + b.gather;
      holds[i % 2] = i;
      gathered[i % 2] = idle;
    };
    // The vocabulary's pieces leave no block where they went (their own
    // transfers are priced with the pass).
    const auto evict = [&](int64_t pieces, int64_t other) {
      if (pieces == 1) holds[other] = -1;
      if (pieces > 1) holds[0] = holds[1] = -1;
    };
    const int64_t after = (b.first + b.blocks) % 2;  // the head's first piece's window
    if (p.gathers && p.forward) evict(b.embedding_pieces, 1);
    if (p.gathers && !p.forward) evict(b.head_pieces, after);
    for (int64_t k = 0; k < b.blocks; ++k) {
      const int64_t i = p.forward ? b.first + k : b.first + b.blocks - 1 - k;
      // (The embedding's weights come first: block 0's include its wait.)
      if (p.forward) wait(published_embedding + published_block * static_cast<double>(i + 1));
      if (p.gathers) {
        gather(i);
        wait(gathered[i % 2]);
        if (k + 1 < b.blocks) gather(p.forward ? i + 1 : i - 1);
      }
      if (p.reduces) wait(grad_free[turn]);
      t += per_block;
      if (p.reduces) {
        idle = std::max(idle, t) + b.reduce;
        grad_free[turn] = idle;
        turn ^= 1;
      } else if (p.final_reduces) {
        issue(b.final_reduce);
      }
    }
    if (p.gathers && p.forward) evict(b.head_pieces, after);
    // The head computes once its weights are in; the embedding's
    // gradients are reduced once its backward (or W) is done.
    if (p.forward && p.head) wait(published_head);
    t += tail;
    issue(p.reduce_last);
    return t;
  }
  // The step's reduction waits for the stream to go idle.
  double drained(double now) {
    if (idle <= now) return now;
    waited += idle - now;
    return idle;
  }
};

}  // namespace

double step_time_floor(ScheduleKind kind, int num_stages, int num_micro, const ActionCosts& costs,
                       int chunks) {
  require_costs_cover(num_stages, chunks, costs);
  const auto n = static_cast<size_t>(num_stages), nv = n * static_cast<size_t>(chunks);
  const auto compiled = compiled_schedule(kind, num_stages, num_micro, chunks);
  const std::vector<double> table = cost_table(kind, n, nv, costs);
  double busiest = 0;
  for (const auto& uses : compiled->work) {
    double busy = 0;
    for (const auto& [at, count] : uses) busy += static_cast<double>(count) * table[static_cast<size_t>(at)];
    busiest = std::max(busiest, busy);
  }
  return (busiest + costs.optimizer) * (1 - 1e-9);
}

SimulatedStep simulate_step(ScheduleKind kind, int num_stages, int num_micro,
                            const ActionCosts& costs, int chunks, bool keep_timeline) {
  require_costs_cover(num_stages, chunks, costs);
  const auto n = static_cast<size_t>(num_stages), nv = n * static_cast<size_t>(chunks);
  const auto compiled = compiled_schedule(kind, num_stages, num_micro, chunks);
  // The actions themselves only for a timeline.
  const auto schedules =
      keep_timeline ? pipeline_schedules(kind, num_stages, num_micro, chunks) : nullptr;
  SimulatedStep out;
  out.compute.assign(n, 0.0);
  out.waiting.assign(n, 0.0);
  out.timeline.assign(keep_timeline ? n : 0, {});
  for (size_t s = 0; s < out.timeline.size(); ++s) out.timeline[s].reserve((*schedules)[s].size());
  // Sends start at once; receives wait, then cost nothing more.
  const std::vector<double> table = cost_table(kind, n, nv, costs);
  std::vector<double> arrivals(compiled->messages, -1.0);  // -1: not sent yet
  std::vector<size_t> next(n, 0);
  std::vector<double> clock(n, 0.0);
  // The passes by their place in the cost table: W makes the gradients
  // where the schedule splits the backward, else the backward.
  const bool streams = !costs.block_transfers.empty();
  const bool split = splits_backward(kind);
  std::vector<ShardStream> stream(streams ? n : 0);
  const size_t pass_at[3] = {forward_at(nv, 0), backward_at(nv, 0), weights_at(nv, 0)};
  for (size_t s = 0; s < stream.size(); ++s) {
    int64_t blocks = 0;
    double per_block = 0;
    for (int c = 0; c < chunks; ++c) {
      const ActionCosts::BlockTransfers& b = costs.block_transfers[static_cast<size_t>(c) * n + s];
      blocks += b.blocks;
      per_block = std::max(per_block, b.publish);
    }
    stream[s].publish(costs.published.empty() ? ActionCosts::Outside{} : costs.published[s],
                      per_block, blocks);
  }
  // Every stage runs until a receive whose message has not been sent yet,
  // or its optimizer step (a barrier); round after round until none moves.
  // Rounds sweep first to last stage, then back: activations flow down and
  // gradients up in one round each (the times do not depend on the order:
  // each action waits for what it receives).
  for (bool moved = true, down = true; moved; down = !down) {
    moved = false;
    for (size_t i = 0; i < n; ++i) {
      const size_t s = down ? i : n - 1 - i;
      const std::vector<CompiledStep>& steps = compiled->stages[s];
      size_t pc = next[s];
      // Summed action by action, as the timeline reads.
      double now = clock[s], waited = out.waiting[s], busy = out.compute[s];
      while (pc < steps.size()) {
        const CompiledStep& c = steps[pc];
        if (c.kind == CompiledStep::kStop) break;
        double start = now;
        if (c.kind == CompiledStep::kRecv) {
          const double at = arrivals[static_cast<size_t>(c.message)];
          if (at < 0) break;
          waited += std::max(0.0, at - start);
          start = std::max(start, at);
        }
        const double seconds = table[static_cast<size_t>(c.cost)];
        double end = start + seconds, worked = end - start;
        if (streams) {
          const size_t at = static_cast<size_t>(c.cost);
          if (c.kind == CompiledStep::kCompute) {
            const size_t pass = at < pass_at[1] ? 0 : at < pass_at[2] ? 1 : 2;
            const size_t vs = at - pass_at[pass];
            const ActionCosts::BlockTransfers& b = costs.block_transfers[vs];
            // The pass that makes the gradients, for the last time this step.
            const bool grads = pass == (split ? 2u : 1u);
            const bool last = grads && c.message == num_micro - 1;
            // The model's last chunk (on the last stage) holds the head;
            // the stage's first chunk what comes before its blocks.
            const bool head = vs == nv - 1;
            const ActionCosts::Outside outside =
                last && !costs.reduced.empty() ? costs.reduced[s] : ActionCosts::Outside{};
            ShardStream::Pass p;
            p.forward = pass == 0;
            p.gathers = b.gather > 0 && pass < 2;
            p.reduces = b.reduce > 0 && grads;
            p.final_reduces = b.final_reduce > 0 && last;
            p.head = head;
            p.reduce_first = head ? outside.head : 0;
            p.reduce_last = vs == s ? outside.embedding : 0;
            if (b.blocks > 0 && (p.forward || p.gathers || p.reduces || p.final_reduces ||
                                 p.reduce_first > 0 || p.reduce_last > 0)) {
              end = stream[s].pass(b, static_cast<int>(pass), start, seconds, p);
              worked = seconds;
            }
          } else if (c.kind == CompiledStep::kRun) {
            start = stream[s].drained(start);
            end = start + seconds;
          }
        }
        if (c.kind == CompiledStep::kSend) arrivals[static_cast<size_t>(c.message)] = start + costs.p2p;
        if (c.kind == CompiledStep::kCompute) busy += worked;
        if (keep_timeline) out.timeline[s].push_back({(*schedules)[s][pc], start, end});
        now = end;
        ++pc;
      }
      if (pc != next[s]) {
        moved = true;
        out.waiting[s] = waited;
        out.compute[s] = busy;
        next[s] = pc;
        clock[s] = now;
      }
    }
  }
  const double barrier = *std::max_element(clock.begin(), clock.end());
  for (size_t s = 0; s < n; ++s) {
    const auto& steps = compiled->stages[s];
    if (next[s] + 1 != steps.size() || steps[next[s]].kind != CompiledStep::kStop) {
      throw std::logic_error(strprintf("simulate_step: stage %zu cannot finish the schedule", s));
    }
    out.waiting[s] += barrier - clock[s];
    if (keep_timeline) out.timeline[s].push_back({(*schedules)[s][next[s]], barrier, barrier + costs.optimizer});
  }
  out.step_time = barrier + costs.optimizer;
  out.reduction_waits.assign(n, 0.0);
  for (size_t s = 0; s < stream.size(); ++s) out.reduction_waits[s] = stream[s].waited;
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
