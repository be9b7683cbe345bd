#include "parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <deque>
#include <limits>
#include <queue>
#include <stdexcept>
#include <tuple>

#include "core/bounded_memo.hpp"

namespace mpiformer {

const char* op_name(Op op) {
  switch (op) {
    case Op::RecvActivation: return "recv_activation";
    case Op::Forward: return "forward";
    case Op::SendActivation: return "send_activation";
    case Op::RecvGradient: return "recv_gradient";
    case Op::Backward: return "backward";
    case Op::SendGradient: return "send_gradient";
    case Op::WeightGradients: return "weight_gradients";
    case Op::ReduceGradients: return "reduce_gradients";
    case Op::OptimizerStep: return "optimizer_step";
  }
  return "?";
}

namespace {

// What ends a micro-batch's hold on its activations: its backward, or its
// W where the schedule splits the backward (W reads what the forward kept).
Op closing_op(const std::vector<Action>& actions) {
  const bool split = std::any_of(actions.begin(), actions.end(),
                                 [](const Action& a) { return a.op == Op::WeightGradients; });
  return split ? Op::WeightGradients : Op::Backward;
}

struct Builder {
  int num_stages, stage, chunks = 1;
  std::vector<Action> out;
  void forward(int m, int c = 0) {
    if (!first_virtual(stage, c)) out.push_back({Op::RecvActivation, m, c});
    out.push_back({Op::Forward, m, c});
    if (!last_virtual(num_stages, stage, c, chunks)) out.push_back({Op::SendActivation, m, c});
  }
  void backward(int m, int c = 0) {
    if (!last_virtual(num_stages, stage, c, chunks)) out.push_back({Op::RecvGradient, m, c});
    out.push_back({Op::Backward, m, c});
    if (!first_virtual(stage, c)) out.push_back({Op::SendGradient, m, c});
  }
  // The W's owed, in micro-batch order, until at most `deferred` are.
  int weights_done = 0;
  void weights_until(int done) {
    while (weights_done < done) out.push_back({Op::WeightGradients, weights_done++});
  }
};

// Megatron's interleaved order: the k-th chunk pass of a direction is
// micro-batch (k / (p v)) p + k % p of chunk (k / p) % v, counted from the
// last chunk for backwards.
void interleaved(Builder& b, int num_micro) {
  const int p = b.num_stages, v = b.chunks, total = num_micro * v;
  const auto micro = [&](int k) { return k / (p * v) * p + k % p; };
  const auto chunk = [&](int k, bool forward) {
    const int c = k / p % v;
    return forward ? c : v - 1 - c;
  };
  const int warmup = std::min(2 * (p - b.stage - 1) + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) b.forward(micro(k), chunk(k, true));
  for (int k = warmup; k < total; ++k) {
    b.forward(micro(k), chunk(k, true));
    b.backward(micro(k - warmup), chunk(k - warmup, false));
  }
  for (int k = total - warmup; k < total; ++k) b.backward(micro(k), chunk(k, false));
}

}  // namespace

std::vector<Action> pipeline_schedule(ScheduleKind kind, int num_stages, int stage, int num_micro,
                                      int chunks) {
  if ((kind == ScheduleKind::kInterleaved) != (chunks > 1) ||
      (chunks > 1 && num_micro % num_stages != 0))
    throw std::invalid_argument("pipeline_schedule: interleaving needs chunks > 1 and whole rounds "
                                "of micro-batches (the deck checks both)");
  Builder b{num_stages, stage, chunks, {}};
  // At most 7 actions a micro-batch's chunk (receive, forward, send; and
  // backward's, and W), and the reduction and the optimizer step.
  b.out.reserve(static_cast<size_t>(std::max(num_micro, 0)) * static_cast<size_t>(std::max(chunks, 1)) * 7 + 2);
  if (kind == ScheduleKind::kInterleaved) {
    interleaved(b, num_micro);
  } else if (kind == ScheduleKind::kGPipe) {
    for (int m = 0; m < num_micro; ++m) b.forward(m);
    for (int m = 0; m < num_micro; ++m) b.backward(m);
  } else {
    // zb-h1: stage s keeps s W's owed; 1F1B: none (its backward has them).
    const int deferred = kind == ScheduleKind::kZbH1 ? stage : 0;
    const bool split = splits_backward(kind);
    auto backward = [&](int m) {
      b.backward(m);
      if (split) b.weights_until(m + 1 - deferred);
    };
    // Warm-up: enough forwards to fill the pipeline below this stage.
    const int warmup = std::min(num_stages - stage - 1, num_micro);
    for (int m = 0; m < warmup; ++m) b.forward(m);
    // Steady state: each new forward is followed by the oldest backward.
    for (int m = warmup; m < num_micro; ++m) {
      b.forward(m);
      backward(m - warmup);
    }
    // Cool-down: drain the backwards still owed, then the W's.
    for (int m = num_micro - warmup; m < num_micro; ++m) backward(m);
    if (split) b.weights_until(num_micro);
  }
  b.out.push_back({Op::ReduceGradients, -1});
  b.out.push_back({Op::OptimizerStep, -1});
  return b.out;
}

std::vector<Action> forward_only_schedule(int num_stages, int stage, int num_micro, int chunks) {
  Builder b{num_stages, stage, chunks, {}};
  for (int m = 0; m < num_micro; ++m)
    for (int c = 0; c < chunks; ++c) b.forward(m, c);
  return b.out;
}

PipePeer activation_to(int num_stages, int stage, int chunk) {
  return stage + 1 < num_stages ? PipePeer{stage + 1, chunk} : PipePeer{0, chunk + 1};
}

PipePeer gradient_to(int num_stages, int stage, int chunk) {
  return stage > 0 ? PipePeer{stage - 1, chunk} : PipePeer{num_stages - 1, chunk - 1};
}

int activation_from(int num_stages, int stage) { return (stage + num_stages - 1) % num_stages; }
int gradient_from(int num_stages, int stage) { return (stage + 1) % num_stages; }

namespace {

// activation_slots and slot_kinds: each action's slot, numbered by kind.
struct SlotAssignment {
  std::vector<int> slot_of;
  SlotKinds kinds;
};

SlotAssignment assign_slots(const std::vector<Action>& actions) {
  const Op closes = closing_op(actions);
  std::vector<int> out(actions.size(), -1);
  // Flat tables by (micro, chunk), and the freed slots in a heap: the
  // planner asks this of every stage of thousands of pipelines (a map and a
  // scan for the first free slot were a tenth of a 65,536-rank search).
  int micros = 0, chunks = 1;
  for (const Action& a : actions) {
    micros = std::max(micros, a.micro + 1);
    chunks = std::max(chunks, a.chunk + 1);
  }
  const auto index = [chunks](const Action& a) {
    return static_cast<size_t>(a.micro) * static_cast<size_t>(chunks) + static_cast<size_t>(a.chunk);
  };
  std::vector<int> slot_of(static_cast<size_t>(micros) * static_cast<size_t>(chunks), -1);
  std::vector<char> open(slot_of.size(), 0);  // kept after it closes: slot_of
  std::priority_queue<int, std::vector<int>, std::greater<>> freed;  // below `next`
  // Per slot: whether every chunk it held was chunk 0, the last chunk.
  std::vector<char> all_first, all_last;
  int next = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.micro < 0) continue;
    const size_t key = index(a);
    if ((a.op == Op::RecvActivation || a.op == Op::Forward) && !open[key]) {
      // The lowest free slot.
      if (freed.empty()) {
        slot_of[key] = next++;
        all_first.push_back(1);
        all_last.push_back(1);
      } else {
        slot_of[key] = freed.top();
        freed.pop();
      }
      open[key] = 1;
      all_first[static_cast<size_t>(slot_of[key])] &= a.chunk == 0;
      all_last[static_cast<size_t>(slot_of[key])] &= a.chunk == chunks - 1;
    }
    if (slot_of[key] < 0) throw std::logic_error("activation_slots: an action before its forward");
    out[i] = slot_of[key];
    if (a.op == closes && open[key]) {
      open[key] = 0;
      freed.push(slot_of[key]);
    }
  }
  // Numbered by kind (SlotKinds), in assignment order within one: a
  // renaming, so which actions share a slot is unchanged.
  SlotAssignment r;
  r.kinds.count = std::max(next, max_live_activations(actions));
  std::vector<int> order(static_cast<size_t>(next));
  const auto kind = [&](int k) {
    const size_t u = static_cast<size_t>(k);
    return all_first[u] && all_last[u] ? 0 : all_first[u] ? 1 : all_last[u] ? 2 : 3;
  };
  for (int k = 0; k < next; ++k) order[static_cast<size_t>(k)] = k;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return kind(a) < kind(b); });
  std::vector<int> renamed(static_cast<size_t>(next));
  for (int k = 0; k < next; ++k) {
    renamed[static_cast<size_t>(order[static_cast<size_t>(k)])] = k;
    const int c = kind(order[static_cast<size_t>(k)]);
    if (c == 0) ++r.kinds.both;
    if (c == 1) ++r.kinds.first;
    if (c == 2) ++r.kinds.last;
  }
  for (int& s : out)
    if (s >= 0) s = renamed[static_cast<size_t>(s)];
  r.slot_of = std::move(out);
  return r;
}

}  // namespace

std::vector<int> activation_slots(const std::vector<Action>& actions) {
  return assign_slots(actions).slot_of;
}

SlotKinds slot_kinds(const std::vector<Action>& actions) { return assign_slots(actions).kinds; }

int max_live_activations(const std::vector<Action>& actions) {
  const Op closes = closing_op(actions);
  int live = 0, most = 0;
  for (const auto& a : actions) {
    if (a.op == Op::Forward) most = std::max(most, ++live);
    if (a.op == closes) --live;
  }
  return std::max(most, 1);
}

namespace {

// One step of every stage as the trainer runs it, where a send completes
// only once its receive is posted (the worst a large message gets):
// receives block; a gradient send with all `buffers` of its stage held
// waits for the oldest; a slot's forward (and its receive, and split
// backward's halves) waits for the slot's previous activation send; the
// step ends once every send completed. Messages of each direction
// between two stages pair up in order (PipelineSchedule tests), so a
// channel is two counters. Whether it runs to the end: a Kahn network's
// outcome does not depend on the interleaving, so one greedy run says.
bool runs_to_the_end(const std::vector<std::vector<Action>>& stages,
                     const std::vector<std::vector<int>>& slots, int buffers) {
  const int pp = static_cast<int>(stages.size());
  struct Channel {
    int64_t posted = 0, received = 0;
  };
  std::vector<Channel> act(pp), grad(pp);  // out of each stage
  struct Stage {
    size_t pc = 0;
    const std::vector<int>* slot_of = nullptr;  // activation_slots of its actions
    std::vector<int64_t> act_sent;      // per slot: its last activation message, or -1
    std::deque<int64_t> grads;          // gradient messages in flight, oldest first
    int limit = 0;
    bool split = false;                 // zb-h1: B and W each wait for the slot's send too
  };
  std::vector<Stage> st(pp);
  for (int s = 0; s < pp; ++s) {
    st[s].slot_of = &slots[static_cast<size_t>(s)];
    st[s].act_sent.assign(static_cast<size_t>(max_live_activations(stages[s])), -1);
    st[s].limit = std::min(buffers, max_live_activations(stages[s]));
    st[s].split = closing_op(stages[s]) == Op::WeightGradients;
  }
  auto slot_free = [&](int s, int slot) {
    const int64_t m = st[s].act_sent[static_cast<size_t>(slot)];
    return m < 0 || act[s].received > m;
  };
  for (;;) {
    bool moved = false, done = true;
    for (int s = 0; s < pp; ++s) {
      Stage& me = st[s];
      while (me.pc < stages[s].size()) {
        const Action& a = stages[s][me.pc];
        const int slot = std::max((*me.slot_of)[me.pc], 0);
        const bool backward = a.op == Op::Backward || a.op == Op::WeightGradients;
        if ((a.op == Op::RecvActivation || a.op == Op::Forward || (backward && me.split)) &&
            !slot_free(s, slot))
          break;
        if (a.op == Op::RecvActivation) {
          Channel& c = act[activation_from(pp, s)];
          if (c.posted <= c.received) break;
          ++c.received;
        } else if (a.op == Op::RecvGradient) {
          Channel& c = grad[gradient_from(pp, s)];
          if (c.posted <= c.received) break;
          ++c.received;
        } else if (a.op == Op::SendActivation) {
          me.act_sent[static_cast<size_t>(slot)] = act[s].posted++;
        } else if (a.op == Op::SendGradient) {
          while (!me.grads.empty() && grad[s].received > me.grads.front()) me.grads.pop_front();
          if (static_cast<int>(me.grads.size()) >= me.limit) break;
          me.grads.push_back(grad[s].posted++);
        }
        ++me.pc;
        moved = true;
      }
      done &= me.pc == stages[s].size();
    }
    if (done) return true;
    if (!moved) return false;
  }
}

// What the planner asks of one stage's schedule, remembered.
struct StageFacts {
  SlotKinds slots;
  bool sends_gradients = false;
};

// A search meets its pipelines' keys in runs, and each pipeline's facts
// are a few bytes a stage: bounded as the schedules are (BoundedMemo).
StageFacts stage_facts(ScheduleKind kind, int num_stages, int stage, int num_micro, int chunks) {
  using Facts = std::vector<StageFacts>;
  static BoundedMemo<std::tuple<ScheduleKind, int, int, int>, Facts> known(1 << 16, 16.0 * (1 << 20));
  const auto all = known.get(
      std::make_tuple(kind, num_stages, num_micro, chunks),
      [&] {
        // Every stage's at once, from the pipeline's remembered lists: the
        // planner asks for each stage in turn, and then compiles the same
        // lists to time the step (schedule_timing.cpp), so they are built
        // once.
        const auto lists = pipeline_schedules(kind, num_stages, num_micro, chunks);
        auto facts = std::make_shared<Facts>();
        for (const std::vector<Action>& actions : *lists) {
          StageFacts f;
          f.slots = slot_kinds(actions);
          f.sends_gradients = std::any_of(actions.begin(), actions.end(),
                                          [](const Action& a) { return a.op == Op::SendGradient; });
          facts->push_back(f);
        }
        return std::shared_ptr<const Facts>(std::move(facts));
      },
      [](const Facts& f) { return static_cast<double>(f.size() * sizeof(StageFacts)); });
  return (*all)[static_cast<size_t>(stage)];
}

}  // namespace

SlotKinds schedule_slots(ScheduleKind kind, int num_stages, int stage, int num_micro, int chunks) {
  return stage_facts(kind, num_stages, stage, num_micro, chunks).slots;
}

std::shared_ptr<const std::vector<std::vector<Action>>> pipeline_schedules(ScheduleKind kind,
                                                                           int num_stages,
                                                                           int num_micro,
                                                                           int chunks) {
  using Lists = std::vector<std::vector<Action>>;
  static BoundedMemo<std::tuple<ScheduleKind, int, int, int>, Lists> known(
      std::numeric_limits<size_t>::max(), 64.0 * (1 << 20));
  return known.get(
      std::make_tuple(kind, num_stages, num_micro, chunks),
      [&] {
        auto lists = std::make_shared<Lists>();
        for (int s = 0; s < num_stages; ++s)
          lists->push_back(pipeline_schedule(kind, num_stages, s, num_micro, chunks));
        return std::shared_ptr<const Lists>(std::move(lists));
      },
      [](const Lists& lists) {
        double bytes = 0;
        for (const auto& l : lists) bytes += static_cast<double>(l.size() * sizeof(Action));
        return bytes;
      });
}

int gradient_send_buffers(ScheduleKind kind, int num_stages, int stage, int num_micro,
                          int chunks) {
  const StageFacts mine = stage_facts(kind, num_stages, stage, num_micro, chunks);
  if (!mine.sends_gradients) return 0;
  const int slots = mine.slots.count;
  // The same answer for every stage of a pipeline (the search asks often).
  static BoundedMemo<std::tuple<ScheduleKind, int, int, int>, int> known(1 << 16, 1.0 * (1 << 20));
  const int buffers = *known.get(
      std::make_tuple(kind, num_stages, num_micro, chunks),
      [&] {
        const auto stages = pipeline_schedules(kind, num_stages, num_micro, chunks);
        std::vector<std::vector<int>> places;  // each stage's slot of each action
        int most = 1;
        for (const auto& actions : *stages) {
          places.push_back(activation_slots(actions));
          most = std::max(most, max_live_activations(actions));
        }
        // Two at least: one send may wait for its receive while the next
        // backward's result is ready to go. Doubled until the step runs to
        // the end; a buffer per slot always does (the trainer's waits
        // before).
        int n = 2;
        while (n < most && !runs_to_the_end(*stages, places, n)) n *= 2;
        return std::make_shared<const int>(n);
      },
      [](const int&) { return static_cast<double>(sizeof(int)); });
  return std::min(buffers, slots);
}

}  // namespace mpiformer
