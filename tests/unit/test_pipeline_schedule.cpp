// Pipeline schedules checked as pure tables over a grid of (stages,
// micro-batches): each micro-batch is run forward then backward exactly once
// per stage (zb-h1: then its W, once), 1F1B keeps at most (pp - s)
// activations on stage s and zb-h1 at most pp on any, and a simulation of
// all stages together (non-blocking sends, blocking receives, as the
// trainer runs them) always completes.
#include <map>
#include <set>

#include "parallel/pipeline_schedule.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

using Schedules = std::vector<std::vector<Action>>;

Schedules all_stages(ScheduleKind kind, int pp, int m) {
  Schedules s;
  for (int st = 0; st < pp; ++st) s.push_back(pipeline_schedule(kind, pp, st, m));
  return s;
}

// Runs every stage's list in lock-free rounds. A send posts a message; a
// receive proceeds only once its message was posted. Returns false on a
// deadlock (no stage can move and some are unfinished).
bool simulate(const Schedules& stages, std::string* why) {
  const int pp = static_cast<int>(stages.size());
  std::vector<size_t> pc(pp, 0);
  std::set<std::tuple<int, int, int>> posted;  // (from, to, tag)
  for (;;) {
    bool moved = false, done = true;
    for (int s = 0; s < pp; ++s) {
      while (pc[s] < stages[s].size()) {
        const Action& a = stages[s][pc[s]];
        const int act = 2 * a.micro, grad = 2 * a.micro + 1;
        if (a.op == Op::RecvActivation && !posted.count({s - 1, s, act})) break;
        if (a.op == Op::RecvGradient && !posted.count({s + 1, s, grad})) break;
        if (a.op == Op::SendActivation) posted.insert({s, s + 1, act});
        if (a.op == Op::SendGradient) posted.insert({s, s - 1, grad});
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

TEST(PipelineSchedule, EveryMicroBatchForwardThenBackwardOnce) {
  for (auto kind : kAllKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 16; ++m)
        for (int s = 0; s < pp; ++s) {
          const auto acts = pipeline_schedule(kind, pp, s, m);
          std::map<int, int> fwd_at, bwd_at, w_at;
          for (size_t i = 0; i < acts.size(); ++i) {
            if (acts[i].op == Op::Forward) {
              EXPECT_TRUE(fwd_at.emplace(acts[i].micro, i).second);
            }
            if (acts[i].op == Op::Backward) {
              EXPECT_TRUE(bwd_at.emplace(acts[i].micro, i).second);
            }
            if (acts[i].op == Op::WeightGradients) {
              EXPECT_TRUE(w_at.emplace(acts[i].micro, i).second);
            }
            // Stage boundaries: nothing received from outside the pipeline.
            if (s == 0) {
              EXPECT_TRUE(acts[i].op != Op::RecvActivation && acts[i].op != Op::SendGradient);
            }
            if (s == pp - 1) {
              EXPECT_TRUE(acts[i].op != Op::SendActivation && acts[i].op != Op::RecvGradient);
            }
          }
          ASSERT_EQ(fwd_at.size(), static_cast<size_t>(m));
          ASSERT_EQ(bwd_at.size(), static_cast<size_t>(m));
          ASSERT_EQ(w_at.size(), splits_backward(kind) ? static_cast<size_t>(m) : 0);
          for (int i = 0; i < m; ++i) {
            EXPECT_LT(fwd_at[i], bwd_at[i]) << "micro " << i;
            // W reads what B left: after it, and in micro-batch order
            // (the gradients accumulate in the order 1F1B's do).
            if (!splits_backward(kind)) continue;
            EXPECT_LT(bwd_at[i], w_at[i]) << "micro " << i;
            if (i > 0) {
              EXPECT_LT(w_at[i - 1], w_at[i]);
            }
          }
          // The step ends with the reduction, then the update.
          EXPECT_EQ(acts[acts.size() - 2].op, Op::ReduceGradients);
          EXPECT_EQ(acts.back().op, Op::OptimizerStep);
        }
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
  for (auto kind : kAllKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 16; ++m) {
        std::string why;
        EXPECT_TRUE(simulate(all_stages(kind, pp, m), &why))
            << name_of(kind) << " pp " << pp << " m " << m << ": " << why;
      }
  std::string why;
  EXPECT_TRUE(simulate({forward_only_schedule(3, 0, 4), forward_only_schedule(3, 1, 4),
                        forward_only_schedule(3, 2, 4)},
                       &why));
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
}  // namespace mpiformer::test
