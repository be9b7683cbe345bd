// Pipeline schedules checked as pure tables over a grid of (stages,
// micro-batches, chunks): each micro-batch is run forward then backward
// exactly once per stage and chunk (zb-h1: then its W, once), 1F1B keeps
// at most (pp - s) activations on stage s, zb-h1 at most pp on any,
// interleaving Megatron's warm-up + 1, and a simulation of all stages
// together (non-blocking sends, blocking receives, as the trainer runs
// them) always completes, with every pair of stages posting its messages
// in the same order on both sides (NCCL matches them in order).
#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "core/rng.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

using Schedules = std::vector<std::vector<Action>>;

Schedules all_stages(ScheduleKind kind, int pp, int m, int v = 1) {
  Schedules s;
  for (int st = 0; st < pp; ++st) s.push_back(pipeline_schedule(kind, pp, st, m, v));
  return s;
}

// Runs every stage's list in lock-free rounds. A send posts a message; a
// receive proceeds only once its message was posted. Messages are named
// by the model's order, written here from the definition: chunk c of
// stage s is virtual stage c pp + s; activations go to the next virtual
// stage, gradients to the previous. Returns false on a deadlock (no stage
// can move and some are unfinished).
bool simulate(const Schedules& stages, std::string* why) {
  const int pp = static_cast<int>(stages.size());
  std::vector<size_t> pc(pp, 0);
  std::set<std::tuple<int, int, int, int>> posted;  // (from, to virtual stage, micro, gradient)
  for (;;) {
    bool moved = false, done = true;
    for (int s = 0; s < pp; ++s) {
      while (pc[s] < stages[s].size()) {
        const Action& a = stages[s][pc[s]];
        const int vs = a.chunk * pp + s;
        if (a.op == Op::RecvActivation && !posted.count({vs - 1, vs, a.micro, 0})) break;
        if (a.op == Op::RecvGradient && !posted.count({vs + 1, vs, a.micro, 1})) break;
        if (a.op == Op::SendActivation) posted.insert({vs, vs + 1, a.micro, 0});
        if (a.op == Op::SendGradient) posted.insert({vs, vs - 1, a.micro, 1});
        ++pc[s];
        moved = true;
      }
      done &= pc[s] == stages[s].size();
    }
    if (done) return true;
    if (!moved) {
      for (int s = 0; s < pp; ++s)
        if (pc[s] < stages[s].size())
          *why += "stage " + std::to_string(s) + " stuck at " + op_name(stages[s][pc[s]].op) +
                  " " + std::to_string(stages[s][pc[s]].micro) + "; ";
      return false;
    }
  }
}

constexpr ScheduleKind kAllKinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                       ScheduleKind::kZbH1};

// Every (stages, micro-batches, chunks) the schedule tests cover: pp <= 8,
// m <= 16, v <= 4 (interleaving: v >= 2, m in whole rounds of pp).
template <class F>
void for_each_layout(F f) {
  for (auto kind : kAllKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 16; ++m) f(kind, pp, m, 1);
  for (int pp = 2; pp <= 8; ++pp)
    for (int v = 2; v <= 4; ++v)
      for (int m = pp; m <= 16; m += pp) f(ScheduleKind::kInterleaved, pp, m, v);
}

std::string where(ScheduleKind kind, int pp, int m, int v) {
  return std::string(name_of(kind)) + " pp " + std::to_string(pp) + " m " + std::to_string(m) +
         " v " + std::to_string(v);
}

TEST(PipelineSchedule, EveryMicroBatchForwardThenBackwardOnce) {
  for_each_layout([](ScheduleKind kind, int pp, int m, int v) {
    for (int s = 0; s < pp; ++s) {
      const auto acts = pipeline_schedule(kind, pp, s, m, v);
      // Keyed by (micro-batch, chunk).
      std::map<std::pair<int, int>, int> fwd_at, bwd_at, w_at;
      for (size_t i = 0; i < acts.size(); ++i) {
        const Action& a = acts[i];
        const std::pair<int, int> key{a.micro, a.chunk};
        if (a.micro >= 0) {
          EXPECT_TRUE(a.chunk >= 0 && a.chunk < v) << where(kind, pp, m, v);
        }
        if (a.op == Op::Forward) {
          EXPECT_TRUE(fwd_at.emplace(key, i).second);
        }
        if (a.op == Op::Backward) {
          EXPECT_TRUE(bwd_at.emplace(key, i).second);
        }
        if (a.op == Op::WeightGradients) {
          EXPECT_TRUE(w_at.emplace(key, i).second);
        }
        // The model's ends: nothing received from before its first
        // virtual stage or after its last.
        if (s == 0 && a.chunk == 0) {
          EXPECT_TRUE(a.op != Op::RecvActivation && a.op != Op::SendGradient);
        }
        if (s == pp - 1 && a.chunk == v - 1) {
          EXPECT_TRUE(a.op != Op::SendActivation && a.op != Op::RecvGradient);
        }
      }
      ASSERT_EQ(fwd_at.size(), static_cast<size_t>(m * v)) << where(kind, pp, m, v);
      ASSERT_EQ(bwd_at.size(), static_cast<size_t>(m * v));
      ASSERT_EQ(w_at.size(), splits_backward(kind) ? static_cast<size_t>(m) : 0);
      for (int c = 0; c < v; ++c)
        for (int i = 0; i < m; ++i) {
          const int f = fwd_at[{i, c}], b = bwd_at[{i, c}];
          EXPECT_LT(f, b) << "micro " << i << " chunk " << c;
          // Each chunk's backwards in micro-batch order: the gradients
          // accumulate in the same order whatever the schedule.
          if (i > 0) {
            const int before = bwd_at[{i - 1, c}];
            EXPECT_LT(before, b) << where(kind, pp, m, v);
          }
          // W reads what B left: after it, and in micro-batch order.
          if (!splits_backward(kind)) continue;
          const int w = w_at[{i, c}];
          EXPECT_LT(b, w) << "micro " << i;
          if (i > 0) {
            const int before = w_at[{i - 1, c}];
            EXPECT_LT(before, w);
          }
        }
      // The step ends with the reduction, then the update.
      EXPECT_EQ(acts[acts.size() - 2].op, Op::ReduceGradients);
      EXPECT_EQ(acts.back().op, Op::OptimizerStep);
    }
  });
}

TEST(PipelineSchedule, OneFOneBBoundsLiveActivations) {
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = 1; m <= 10; ++m)
      for (int s = 0; s < pp; ++s) {
        const int live = max_live_activations(pipeline_schedule(ScheduleKind::kOneFOneB, pp, s, m));
        EXPECT_LE(live, pp - s) << "pp " << pp << " m " << m << " stage " << s;
        EXPECT_EQ(live, std::min(pp - s, m));
        EXPECT_EQ(max_live_activations(pipeline_schedule(ScheduleKind::kGPipe, pp, s, m)), m);
      }
}

// zb-h1 holds a micro-batch from its forward to its W: stage s up to s
// W's longer than 1F1B, never more than 1F1B's fullest stage (stage 0).
TEST(PipelineSchedule, ZeroBubbleH1KeepsOneFOneBsPeak) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m) {
      const int peak = max_live_activations(pipeline_schedule(ScheduleKind::kOneFOneB, pp, 0, m));
      for (int s = 0; s < pp; ++s) {
        const auto acts = pipeline_schedule(ScheduleKind::kZbH1, pp, s, m);
        EXPECT_EQ(max_live_activations(acts), std::min(pp, m)) << "pp " << pp << " m " << m;
        EXPECT_LE(max_live_activations(acts), peak);
        // Stage s owes at most s W's when it starts a forward.
        int owed = 0, most = 0;
        for (const Action& a : acts) {
          owed += a.op == Op::Backward ? 1 : a.op == Op::WeightGradients ? -1 : 0;
          if (a.op == Op::Forward) most = std::max(most, owed);
        }
        EXPECT_LE(most, s) << "pp " << pp << " m " << m << " stage " << s;
        if (m >= 2 * pp) {
          EXPECT_EQ(most, s) << "pp " << pp << " m " << m << " stage " << s;
        }
      }
    }
}

TEST(PipelineSchedule, ZeroBubbleH1OrderForThreeStages) {
  // pp = 3, m = 4, the last stage: F B per micro-batch, its W's two behind.
  std::vector<std::pair<Op, int>> compute;
  for (const auto& a : pipeline_schedule(ScheduleKind::kZbH1, 3, 2, 4))
    if (a.op == Op::Forward || a.op == Op::Backward || a.op == Op::WeightGradients)
      compute.emplace_back(a.op, a.micro);
  const std::vector<std::pair<Op, int>> want = {
      {Op::Forward, 0}, {Op::Backward, 0}, {Op::Forward, 1}, {Op::Backward, 1},
      {Op::Forward, 2}, {Op::Backward, 2}, {Op::WeightGradients, 0}, {Op::Forward, 3},
      {Op::Backward, 3}, {Op::WeightGradients, 1}, {Op::WeightGradients, 2},
      {Op::WeightGradients, 3}};
  EXPECT_EQ(compute, want);
}

TEST(PipelineSchedule, SimulatedRunNeverDeadlocks) {
  for_each_layout([](ScheduleKind kind, int pp, int m, int v) {
    std::string why;
    EXPECT_TRUE(simulate(all_stages(kind, pp, m, v), &why)) << where(kind, pp, m, v) << ": " << why;
  });
  for (int v = 1; v <= 3; ++v) {
    std::string why;
    EXPECT_TRUE(simulate({forward_only_schedule(3, 0, 4, v), forward_only_schedule(3, 1, 4, v),
                          forward_only_schedule(3, 2, 4, v)},
                         &why))
        << "forward only, v " << v << ": " << why;
  }
}

// Runs every stage's list in a random interleaving as the trainer runs
// it when a send completes only once its receive is posted (the worst a
// large message gets): receives block; a gradient send with all
// `buffers[s]` held waits for the oldest in flight; a slot's receive and
// forward (zb-h1: its B and W too) wait for the slot's previous
// activation send. Written from the model's order (virtual stages), not
// the library's channels. Returns whether every stage reached its end.
bool completes_with_send_buffers(const Schedules& stages, const std::vector<int>& buffers,
                                 uint64_t seed) {
  const int pp = static_cast<int>(stages.size());
  Rng rng(seed, 0);
  using Message = std::tuple<int, int, int, int>;  // (from, to virtual stage, micro, gradient)
  std::set<Message> posted, received;
  std::vector<size_t> pc(pp, 0);
  std::vector<std::vector<int>> slots(pp);
  std::vector<std::map<int, Message>> act_in_slot(pp);
  std::vector<std::deque<Message>> grads(pp);
  for (int s = 0; s < pp; ++s) slots[s] = activation_slots(stages[s]);
  auto can_move = [&](int s) {
    if (pc[s] == stages[s].size()) return false;
    const Action& a = stages[s][pc[s]];
    const int vs = a.chunk * pp + s;
    const bool split = a.op == Op::WeightGradients ||
                       (a.op == Op::Backward &&
                        std::any_of(stages[s].begin(), stages[s].end(),
                                    [](const Action& x) { return x.op == Op::WeightGradients; }));
    if (a.op == Op::RecvActivation || a.op == Op::Forward || split) {
      const auto it = act_in_slot[s].find(slots[s][pc[s]]);
      if (it != act_in_slot[s].end() && !received.count(it->second)) return false;
    }
    if (a.op == Op::RecvActivation) return posted.count({vs - 1, vs, a.micro, 0}) > 0;
    if (a.op == Op::RecvGradient) return posted.count({vs + 1, vs, a.micro, 1}) > 0;
    if (a.op == Op::SendGradient) {
      auto& q = grads[s];
      while (!q.empty() && received.count(q.front())) q.pop_front();
      return static_cast<int>(q.size()) < buffers[s];
    }
    return true;
  };
  for (;;) {
    std::vector<int> movable;
    for (int s = 0; s < pp; ++s)
      if (can_move(s)) movable.push_back(s);
    if (movable.empty()) break;
    const int s = movable[rng.below(movable.size())];
    const Action& a = stages[s][pc[s]];
    const int vs = a.chunk * pp + s;
    if (a.op == Op::RecvActivation) received.insert({vs - 1, vs, a.micro, 0});
    if (a.op == Op::RecvGradient) received.insert({vs + 1, vs, a.micro, 1});
    if (a.op == Op::SendActivation) {
      posted.insert({vs, vs + 1, a.micro, 0});
      act_in_slot[s][slots[s][pc[s]]] = {vs, vs + 1, a.micro, 0};
    }
    if (a.op == Op::SendGradient) {
      posted.insert({vs, vs - 1, a.micro, 1});
      grads[s].push_back({vs, vs - 1, a.micro, 1});
    }
    ++pc[s];
  }
  for (int s = 0; s < pp; ++s)
    if (pc[s] < stages[s].size()) return false;
  return true;
}

// Input-gradient send buffers (gradient_send_buffers): with that many a
// stage, every step completes in random interleavings of every layout;
// never more than the activation slots (a buffer per slot before), far
// fewer under interleaving. And the check can fail: with none, a stage
// that sends gradients never gets past its first.
TEST(PipelineSchedule, GradientSendBuffersLetEveryInterleavingComplete) {
  for_each_layout([&](ScheduleKind kind, int pp, int m, int v) {
    const Schedules stages = all_stages(kind, pp, m, v);
    std::vector<int> buffers(pp);
    bool sends = false;
    for (int s = 0; s < pp; ++s) {
      buffers[s] = gradient_send_buffers(kind, pp, s, m, v);
      const int slots = max_live_activations(stages[s]);
      EXPECT_LE(buffers[s], slots) << where(kind, pp, m, v) << " stage " << s;
      EXPECT_LE(buffers[s], 2) << where(kind, pp, m, v) << " stage " << s;
      int n = 0;
      for (const Action& a : stages[s]) n += a.op == Op::SendGradient;
      EXPECT_EQ(buffers[s] == 0, n == 0) << where(kind, pp, m, v) << " stage " << s;
      sends |= n > 0;
    }
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      EXPECT_TRUE(completes_with_send_buffers(stages, buffers, seed)) << where(kind, pp, m, v);
    }
    if (sends) {
      EXPECT_FALSE(completes_with_send_buffers(stages, std::vector<int>(pp, 0), 1))
          << where(kind, pp, m, v);
    }
  });
  // Megatron's Table 1 trillion-parameter layout, interleaved: 191 slots
  // on the first stage, two buffers.
  const auto first = pipeline_schedule(ScheduleKind::kInterleaved, 64, 0, 512, 2);
  EXPECT_EQ(max_live_activations(first), 191);
  EXPECT_EQ(gradient_send_buffers(ScheduleKind::kInterleaved, 64, 0, 512, 2), 2);
}

// The trainer's routing (activation_to, gradient_to, the receive's peer,
// the tags) is the model's order above, and every pair of stages sends
// and receives its messages of each direction in the same order (NCCL
// pairs a send with a receive by their order, MPI by tag).
TEST(PipelineSchedule, MessagesPairUpInOrder) {
  for_each_layout([](ScheduleKind kind, int pp, int m, int v) {
    // (from, to, gradient) -> the messages' tags in posting order.
    std::map<std::tuple<int, int, int>, std::vector<int>> sent, received;
    for (int s = 0; s < pp; ++s)
      for (const Action& a : pipeline_schedule(kind, pp, s, m, v)) {
        const int vs = a.chunk * pp + s;
        if (a.op == Op::SendActivation || a.op == Op::SendGradient) {
          const bool grad = a.op == Op::SendGradient;
          const PipePeer to = grad ? gradient_to(pp, s, a.chunk) : activation_to(pp, s, a.chunk);
          ASSERT_EQ(to.chunk * pp + to.stage, grad ? vs - 1 : vs + 1) << where(kind, pp, m, v);
          sent[{s, to.stage, grad}].push_back(grad ? gradient_tag(a.micro, to.chunk, v)
                                                   : activation_tag(a.micro, to.chunk, v));
        }
        if (a.op == Op::RecvActivation) {
          const int from = activation_from(pp, s);
          ASSERT_EQ(from, (vs - 1) % pp);
          received[{from, s, 0}].push_back(activation_tag(a.micro, a.chunk, v));
        }
        if (a.op == Op::RecvGradient) {
          const int from = gradient_from(pp, s);
          ASSERT_EQ(from, (vs + 1) % pp);
          received[{from, s, 1}].push_back(gradient_tag(a.micro, a.chunk, v));
        }
      }
    EXPECT_EQ(sent, received) << where(kind, pp, m, v);
    for (const auto& [pair, tags] : received) {
      EXPECT_EQ(std::set<int>(tags.begin(), tags.end()).size(), tags.size()) << "a tag reused";
    }
  });
}

// Megatron's interleaved order (Narayanan et al. 2021, fig. 4): pp = 2,
// v = 2, m = 4, stage 0: a round of two micro-batches through chunk 0,
// then chunk 1, ... backwards from chunk 1.
TEST(PipelineSchedule, InterleavedOrderForTwoStages) {
  std::vector<std::tuple<Op, int, int>> compute;
  for (const auto& a : pipeline_schedule(ScheduleKind::kInterleaved, 2, 0, 4, 2))
    if (a.op == Op::Forward || a.op == Op::Backward) compute.emplace_back(a.op, a.micro, a.chunk);
  // Warm-up 2 (2 - 0 - 1) + (2 - 1) 2 = 4 chunk forwards.
  const std::vector<std::tuple<Op, int, int>> want = {
      {Op::Forward, 0, 0},  {Op::Forward, 1, 0},  {Op::Forward, 0, 1},  {Op::Forward, 1, 1},
      {Op::Forward, 2, 0},  {Op::Backward, 0, 1}, {Op::Forward, 3, 0},  {Op::Backward, 1, 1},
      {Op::Forward, 2, 1},  {Op::Backward, 0, 0}, {Op::Forward, 3, 1},  {Op::Backward, 1, 0},
      {Op::Backward, 2, 1}, {Op::Backward, 3, 1}, {Op::Backward, 2, 0}, {Op::Backward, 3, 0}};
  EXPECT_EQ(compute, want);
}

// Stage s holds its warm-up's chunk passes plus one: on stage 0,
// 2 (pp - 1) + (v - 1) pp + 1 chunks of n_layer / (pp v) layers, that is
// (1 + (pp - 1) / (pp v)) times 1F1B's pp stages' worth.
TEST(PipelineSchedule, InterleavedLiveActivations) {
  for (int pp = 2; pp <= 8; ++pp)
    for (int v = 2; v <= 4; ++v)
      for (int m = pp; m <= 16; m += pp)
        for (int s = 0; s < pp; ++s) {
          const auto acts = pipeline_schedule(ScheduleKind::kInterleaved, pp, s, m, v);
          const int warmup = std::min(2 * (pp - s - 1) + (v - 1) * pp, m * v);
          EXPECT_EQ(max_live_activations(acts), std::min(warmup + 1, m * v))
              << where(ScheduleKind::kInterleaved, pp, m, v) << " stage " << s;
          // The slots the trainer assigns: never two live chunk passes in
          // one, never more slots than that.
          const std::vector<int> slots = activation_slots(acts);
          std::map<int, std::pair<int, int>> holder;  // slot -> (micro, chunk)
          int most = 0;
          for (size_t i = 0; i < acts.size(); ++i) {
            const Action& a = acts[i];
            if (a.micro < 0) {
              EXPECT_EQ(slots[i], -1);
              continue;
            }
            most = std::max(most, slots[i] + 1);
            const std::pair<int, int> key{a.micro, a.chunk};
            if (a.op == Op::RecvActivation || (a.op == Op::Forward && s == 0 && a.chunk == 0)) {
              EXPECT_FALSE(holder.count(slots[i])) << "slot " << slots[i] << " taken";
              holder[slots[i]] = key;
            }
            // The send after a backward still reads the slot it freed.
            const auto it = holder.find(slots[i]);
            if (a.op == Op::SendGradient && it == holder.end()) continue;
            ASSERT_TRUE(it != holder.end()) << "slot " << slots[i] << " used while free";
            EXPECT_EQ(it->second, key) << where(ScheduleKind::kInterleaved, pp, m, v);
            if (a.op == Op::Backward) holder.erase(it);
          }
          EXPECT_EQ(most, max_live_activations(acts));
        }
}

// What each slot holds (core/slot_kinds.hpp), against the actions: a slot
// counted as holding only chunk 0 (only the last chunk) holds no other,
// since the stage allocates it that chunk's layers alone; the counts add
// up within the slots. With one chunk a stage every slot holds only it.
// On interleaved stage 0 of 4 x 2 chunks with 8 micro-batches, 6 of its 11
// slots hold chunk-0 passes only: a lowest-free-slot walk of the stage's
// 32 passes, done apart from this code: F0.0-F3.0 take 0-3, F0.1-F3.1
// 4-7, F4.0-F6.0 8-10; B0.1 frees 4 for F7.0, B1.1-B3.1 free 5-7 for
// F4.1-F6.1, B0.0 frees 0 for F7.1; so 1-3 and 8-10 hold chunk 0 alone.
TEST(PipelineSchedule, SlotKinds) {
  for (const ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                  ScheduleKind::kZbH1, ScheduleKind::kInterleaved})
    for (int pp = 2; pp <= 8; pp *= 2)
      for (int v = 1; v <= (kind == ScheduleKind::kInterleaved ? 4 : 1); ++v)
        for (int m = pp; m <= 4 * pp; m += pp)
          for (int s = 0; s < pp; ++s) {
            if (kind == ScheduleKind::kInterleaved && v == 1) continue;
            const auto acts = pipeline_schedule(kind, pp, s, m, v);
            const SlotKinds k = slot_kinds(acts);
            const std::vector<int> slots = activation_slots(acts);
            EXPECT_EQ(k.count, max_live_activations(acts));
            EXPECT_LE(k.both + k.first + k.last, k.count);
            EXPECT_EQ(k.both, v == 1 ? k.count : 0) << where(kind, pp, m, v);
            for (size_t i = 0; i < acts.size(); ++i) {
              if (acts[i].micro < 0) continue;
              if (k.first_only(slots[i])) {
                EXPECT_EQ(acts[i].chunk, 0) << where(kind, pp, m, v);
              }
              if (k.last_only(slots[i])) {
                EXPECT_EQ(acts[i].chunk, v - 1) << where(kind, pp, m, v);
              }
            }
          }
  const SlotKinds first = slot_kinds(pipeline_schedule(ScheduleKind::kInterleaved, 4, 0, 8, 2));
  EXPECT_EQ(first.count, 11);
  EXPECT_EQ(first.first, 6);
}

// The simulation itself must be able to fail: a stage that waits for a
// gradient before sending its activation deadlocks with its neighbour.
TEST(PipelineSchedule, SimulationDetectsADeadlock) {
  Schedules bad = all_stages(ScheduleKind::kOneFOneB, 2, 2);
  bad[0] = {{Op::Forward, 0}, {Op::RecvGradient, 0}, {Op::SendActivation, 0}, {Op::Backward, 0}};
  std::string why;
  EXPECT_FALSE(simulate(bad, &why));
  EXPECT_NE(why.find("stage 0 stuck at recv_gradient"), std::string::npos) << why;
}

TEST(PipelineSchedule, OneFOneBMatchesMegatronOrderForTwoStages) {
  // pp = 2, m = 3, stage 0: one warm-up forward, then F1 B0, F2 B1, then B2.
  const auto acts = pipeline_schedule(ScheduleKind::kOneFOneB, 2, 0, 3);
  std::vector<std::pair<Op, int>> compute;
  for (const auto& a : acts)
    if (a.op == Op::Forward || a.op == Op::Backward) compute.emplace_back(a.op, a.micro);
  const std::vector<std::pair<Op, int>> want = {{Op::Forward, 0}, {Op::Forward, 1}, {Op::Backward, 0},
                                                {Op::Forward, 2}, {Op::Backward, 1}, {Op::Backward, 2}};
  EXPECT_EQ(compute, want);
}

}  // namespace
// What the planner remembers of schedules: every stage's list as built,
// and each stage's slots, for every kind; the same lists on a second ask.
TEST(PipelineSchedule, RememberedSchedulesAreTheSchedules) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZbH1,
                            ScheduleKind::kInterleaved}) {
    const int chunks = kind == ScheduleKind::kInterleaved ? 2 : 1;
    const auto lists = pipeline_schedules(kind, 4, 8, chunks);
    ASSERT_EQ(lists->size(), 4u);
    EXPECT_EQ(pipeline_schedules(kind, 4, 8, chunks).get(), lists.get());
    for (int s = 0; s < 4; ++s) {
      const std::vector<Action> fresh = pipeline_schedule(kind, 4, s, 8, chunks);
      EXPECT_EQ((*lists)[static_cast<size_t>(s)], fresh);
      const SlotKinds k = schedule_slots(kind, 4, s, 8, chunks), want = slot_kinds(fresh);
      EXPECT_EQ(k.count, max_live_activations(fresh));
      EXPECT_EQ(std::make_tuple(k.count, k.both, k.first, k.last),
                std::make_tuple(want.count, want.both, want.first, want.last));
    }
    EXPECT_NE(pipeline_schedules(kind, 4, 12, chunks).get(), lists.get());
  }
}

}  // namespace mpiformer::test
