// The step-time simulator on schedules with known answers: with equal
// stages and free messages the idle share is the textbook bubble
// (pp - 1) / (m + pp - 1) under both schedules; a stage twice as slow sets
// the pace (GPipe's step is every stage's fill and drain plus m - 1 of the
// slowest stage's micro-batches, and the slow stage waits least); messages
// and reductions add where they fall. Tolerance: 1e-12 (sums of a few
// doubles).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>
#include <vector>

#include "core/settings.hpp"
#include "parallel/schedule_timing.hpp"

namespace mpiformer::test {
namespace {

// `n` stages of equal costs.
ActionCosts equal(int n, double f, double b) {
  ActionCosts c;
  c.forward.assign(n, f);
  c.backward.assign(n, b);
  c.reduce.assign(n, 0.0);
  return c;
}

TEST(ScheduleTiming, EqualStagesGiveTheTextbookBubble) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (int pp : {1, 2, 4, 8}) {
      for (int m : {1, 2, 4, 7, 16}) {
        const SimulatedStep s = simulate_step(kind, pp, m, equal(pp, 1.0, 2.0));
        const double want = static_cast<double>(pp - 1) / (m + pp - 1);
        EXPECT_NEAR(s.idle_fraction(), want, 1e-12) << "pp " << pp << ", m " << m;
        EXPECT_NEAR(s.step_time, 3.0 * (m + pp - 1), 1e-12) << "pp " << pp << ", m " << m;
      }
    }
  }
}

// zb-h1 against the paper's accounting (Qi et al. 2024, table 1): with
// m >= pp and W no longer than B, every stage idles (pp - 1)(F + B - W),
// against 1F1B's (pp - 1)(F + B + W). Where W > B or m < pp the deferred
// W's cannot fill the whole drain: never worse than 1F1B, never better
// than the fill no schedule avoids ((pp - 1) F). Tolerance 1e-9: sums of
// at most a few hundred doubles.
TEST(ScheduleTiming, ZeroBubbleH1MeetsItsTheory) {
  struct Times {
    double f, b, w;
  };
  for (const Times t : {Times{1, 1, 1}, Times{1, 1.5, 0.5}, Times{1, 2, 1}, Times{2, 1, 1},
                        Times{1, 1.2, 0.8}, Times{1, 1, 1.5}, Times{1, 0.5, 2}}) {
    for (int pp = 1; pp <= 8; ++pp) {
      for (int m = 1; m <= 16; ++m) {
        ActionCosts c = equal(pp, t.f, t.b);
        c.weights.assign(pp, t.w);
        const SimulatedStep zb = simulate_step(ScheduleKind::kZbH1, pp, m, c);
        const SimulatedStep ob = simulate_step(ScheduleKind::kOneFOneB, pp, m, c);
        const double work = m * (t.f + t.b + t.w);
        EXPECT_NEAR(ob.step_time, work + (pp - 1) * (t.f + t.b + t.w), 1e-9);
        for (int s = 0; s < pp; ++s) EXPECT_NEAR(zb.compute[s], work, 1e-9);
        const std::string at = "pp " + std::to_string(pp) + " m " + std::to_string(m) + " F/B/W " +
                               std::to_string(t.f) + "/" + std::to_string(t.b) + "/" +
                               std::to_string(t.w);
        if (m >= pp && t.w <= t.b) {
          EXPECT_NEAR(zb.step_time, work + (pp - 1) * (t.f + t.b - t.w), 1e-9) << at;
        } else {
          EXPECT_LE(zb.step_time, ob.step_time + 1e-9) << at;
          EXPECT_GE(zb.step_time, work + (pp - 1) * t.f - 1e-9) << at;
        }
      }
    }
  }
}

// Interleaving against Narayanan et al. (SC'21, section 2.2.2): with v
// chunks per stage, each chunk pass a v-th of a stage's forward or
// backward, the bubble is (pp - 1)(F + B) / v, against 1F1B's
// (pp - 1)(F + B), with m in whole rounds of pp. Tolerance 1e-9.
TEST(ScheduleTiming, InterleavedMeetsItsTheory) {
  for (const auto& [f, b] : {std::pair{1.0, 2.0}, std::pair{1.0, 1.0}, std::pair{2.0, 3.0}}) {
    for (int pp = 2; pp <= 8; ++pp) {
      for (int v = 2; v <= 4; ++v) {
        for (int m = pp; m <= 16; m += pp) {
          ActionCosts c = equal(pp * v, f / v, b / v);  // per virtual stage
          c.reduce.assign(pp, 0.0);
          const SimulatedStep s = simulate_step(ScheduleKind::kInterleaved, pp, m, c, v);
          const std::string at = "pp " + std::to_string(pp) + " v " + std::to_string(v) + " m " +
                                 std::to_string(m) + " F/B " + std::to_string(f) + "/" +
                                 std::to_string(b);
          for (int st = 0; st < pp; ++st) EXPECT_NEAR(s.compute[st], m * (f + b), 1e-9) << at;
          EXPECT_NEAR(s.step_time, m * (f + b) + (pp - 1) * (f + b) / v, 1e-9) << at;
        }
      }
    }
  }
}

TEST(ScheduleTiming, ASlowStageSetsThePace) {
  const int pp = 4, m = 8;
  ActionCosts c = equal(pp, 1.0, 2.0);
  c.forward[1] = 2.0;
  c.backward[1] = 4.0;
  const SimulatedStep g = simulate_step(ScheduleKind::kGPipe, pp, m, c);
  // Forward: the fill through every stage, then m - 1 forwards at the slow
  // stage's pace; backward likewise.
  const double fill = std::accumulate(c.forward.begin(), c.forward.end(), 0.0) +
                      std::accumulate(c.backward.begin(), c.backward.end(), 0.0);
  EXPECT_NEAR(g.step_time, fill + (m - 1) * (2.0 + 4.0), 1e-12);
  for (const SimulatedStep& s : {g, simulate_step(ScheduleKind::kOneFOneB, pp, m, c)}) {
    const auto least = std::min_element(s.waiting.begin(), s.waiting.end()) - s.waiting.begin();
    EXPECT_EQ(least, 1) << "the slow stage waits least";
    EXPECT_NEAR(s.compute[1], m * 6.0, 1e-12);
    // Never faster than the slow stage's own work.
    EXPECT_GE(s.step_time, m * 6.0);
  }
}

// The floor a search prunes with: never above the simulated step, and
// exactly the busiest stage's own work (its compute and reduction) plus
// the optimizer, within the part in 1e9 it gives up for rounding. Uneven
// stages and messages, so that stages wait; every schedule.
TEST(ScheduleTiming, TheFloorIsTheBusiestStagesOwnWork) {
  for (const ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                                  ScheduleKind::kZbH1, ScheduleKind::kInterleaved}) {
    for (const int pp : {1, 2, 4}) {
      if (kind == ScheduleKind::kInterleaved && pp == 1) continue;
      const int v = kind == ScheduleKind::kInterleaved ? 2 : 1;
      for (const int m : {4, 8}) {
        ActionCosts c;
        for (int i = 0; i < pp * v; ++i) {
          c.forward.push_back(1.0 + 0.37 * i);
          c.backward.push_back(2.0 + 0.11 * ((i * 7) % 5));
          c.weights.push_back(0.5 + 0.05 * i);
        }
        for (int s = 0; s < pp; ++s) c.reduce.push_back(0.3 * s);
        c.p2p = 0.2;
        c.optimizer = 0.125;
        const SimulatedStep sim = simulate_step(kind, pp, m, c, v);
        const double floor = step_time_floor(kind, pp, m, c, v);
        const std::string at = std::string(name_of(kind)) + " pp " + std::to_string(pp) +
                               " m " + std::to_string(m);
        EXPECT_LE(floor, sim.step_time) << at;
        double busiest = 0;
        for (int s = 0; s < pp; ++s)
          busiest = std::max(busiest, sim.compute[static_cast<size_t>(s)] + c.reduce[static_cast<size_t>(s)]);
        EXPECT_NEAR(floor, busiest + c.optimizer, 2e-9 * (busiest + c.optimizer)) << at;
        if (pp == 1) {
          EXPECT_NEAR(floor, sim.step_time, 2e-9 * sim.step_time) << at;
        }
      }
    }
  }
}

TEST(ScheduleTiming, MessagesReductionsAndTheOptimizerAdd) {
  const int pp = 2, m = 4;
  ActionCosts c = equal(pp, 1.0, 2.0);
  const double base = simulate_step(ScheduleKind::kOneFOneB, pp, m, c).step_time;
  EXPECT_EQ(base, simulate_step(ScheduleKind::kGPipe, pp, m, c).step_time);
  c.p2p = 0.25;
  // GPipe crosses the stage boundary on its critical path twice (the
  // forward fill, the backward drain); 1F1B waits on a round trip for every
  // micro-batch of stage 0 (worked by hand for m = 4: 16 s).
  EXPECT_NEAR(simulate_step(ScheduleKind::kGPipe, pp, m, c).step_time, base + 2 * 0.25, 1e-12);
  EXPECT_NEAR(simulate_step(ScheduleKind::kOneFOneB, pp, m, c).step_time, 16.0, 1e-12);
  c.p2p = 0;
  c.reduce = {0.5, 0.0};  // stage 0 reduces last: all of it is exposed
  c.optimizer = 0.125;
  const SimulatedStep s = simulate_step(ScheduleKind::kOneFOneB, pp, m, c);
  EXPECT_NEAR(s.step_time, base + 0.5 + 0.125, 1e-12);
  // Every stage's timeline ends with the optimizer step, at the same time.
  EXPECT_EQ(s.timeline[0].back().action.op, Op::OptimizerStep);
  EXPECT_EQ(s.timeline[0].back().start, s.timeline[1].back().start);
  const std::string trace = timeline_trace(s);
  EXPECT_NE(trace.find("\"stage 1 (predicted)\""), std::string::npos);
  EXPECT_EQ(std::count(trace.begin(), trace.end(), '\n') > 2 * m * pp, true);
}

// ZeRO 2-3's reductions on a device (ActionCosts::block_transfers),
// timelines worked by hand on one stage: F 1 s, a backward of two blocks
// (1 s each), each block's transfer `r` on the stream after its backward,
// two gradient windows taken in turn (a block's backward waits for the
// transfer before the last), the step's reduction (0.5 s) after the
// stream is idle, the optimizer 0.125 s. Exact: dyadic sums.
TEST(ScheduleTiming, BlockReductionsRunBesideThePassesThatFollow) {
  const auto costs = [](double b, double r) {
    ActionCosts c = equal(1, 1.0, b);
    c.reduce = {0.5};
    c.optimizer = 0.125;
    c.block_transfers = {{0, 2, r}};
    return c;
  };
  // 1F1B, r 3: F0 0-1; B0's blocks 1-2 and 2-3, their transfers 2-5 and
  // 5-8; F1 3-4; B1's first block waits for window 1 (free at 5) and runs
  // 5-6, its second for window 0 (8) and runs 8-9; transfers 8-11, 11-14;
  // the reduction waits from 9 to 14.
  SimulatedStep s = simulate_step(ScheduleKind::kOneFOneB, 1, 2, costs(2, 3));
  EXPECT_EQ(s.step_time, 14.625);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{1 + 2 + 5});
  EXPECT_EQ(s.compute[0], 6.0);
  // GPipe, r 3: both forwards first (0-2); B0 2-4, transfers 3-6, 6-9; B1
  // waits 2 s for each window (to 6 and 9), ends 10; transfers to 15.
  s = simulate_step(ScheduleKind::kGPipe, 1, 2, costs(2, 3));
  EXPECT_EQ(s.step_time, 15.625);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{2 + 2 + 5});
  // r 0.5: everything hides but the last block's transfer (6 to 6.5).
  s = simulate_step(ScheduleKind::kOneFOneB, 1, 2, costs(2, 0.5));
  EXPECT_EQ(s.step_time, 7.125);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{0.5});
  // Transfers that take no time change nothing.
  ActionCosts none = costs(2, 0);
  EXPECT_EQ(simulate_step(ScheduleKind::kOneFOneB, 1, 2, none).step_time, 6.625);
  none.block_transfers.clear();
  EXPECT_EQ(simulate_step(ScheduleKind::kOneFOneB, 1, 2, none).step_time, 6.625);
  // zb-h1: the weight-gradient pass (W 2 s) makes the gradients, not B
  // (1 s): F 0-1, B 1-2, W's blocks 2-3 and 3-4, transfers 3-6 and 6-9.
  ActionCosts zb = costs(1, 3);
  zb.weights = {2};
  s = simulate_step(ScheduleKind::kZbH1, 1, 1, zb);
  EXPECT_EQ(s.step_time, 9.625);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{5});
  // A chunk of one block takes the windows in turn too: B1 does not wait
  // for B0's transfer, B2 does. 1F1B, b 1, r 4: F0 0-1, B0 1-2 (transfer
  // 2-6), F1 2-3, B1 3-4 (6-10), F2 4-5, B2 6-7 (10-14), the reduction
  // 14-14.5.
  ActionCosts one = costs(1, 4);
  one.block_transfers = {{0, 1, 4}};
  s = simulate_step(ScheduleKind::kOneFOneB, 1, 3, one);
  EXPECT_EQ(s.step_time, 14.625);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{1 + 7});
  one.block_transfers = {{0, 1, 3}, {0, 1, 3}};
  EXPECT_THROW(simulate_step(ScheduleKind::kOneFOneB, 1, 2, one), std::invalid_argument);
}

// Zero 3's gathers on the same stream, worked by hand: one stage of four
// blocks, F and B 1 s a block, a gather 1.5 s, the reduce-scatters free
// (they still queue behind the gathers). Forward: block 0 waits for its
// gather (0-1.5); each later block's gather starts as the block before it
// starts and ends 0.5 s after that block: three waits of 0.5; F ends at
// 7 with blocks 2 and 3 in the windows. Backward: blocks 3 and 2 are held;
// block 1's gather starts at 8 (as block 2 starts) and ends at 9.5, block
// 0's at 11: two waits of 0.5, the end at 12.
TEST(ScheduleTiming, GathersQueueOnTheStreamAndHeldBlocksAreNotGatheredAgain) {
  ActionCosts c = equal(1, 4.0, 4.0);
  c.reduce = {0.5};
  c.optimizer = 0.125;
  c.block_transfers = {{0, 4, 0.0, 1.5}};
  const SimulatedStep s = simulate_step(ScheduleKind::kOneFOneB, 1, 1, c);
  EXPECT_EQ(s.step_time, 12.625);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{1.5 + 3 * 0.5 + 2 * 0.5});
  EXPECT_EQ(s.compute[0], 8.0);
}

// The same, with zero 3's vocabulary beside the last block (the head's
// pieces after the forward, StageLayout::window_of): one piece takes
// window 0 (4 % 2), where block 2 was, so the backward holds block 3
// only: block 2's gather runs 7-8.5 while block 3 computes, a wait of 0.5,
// then blocks 1 and 0 as before: the end at 12.5. Two pieces take both
// windows: block 3's gather 7-8.5 waits 1.5, then each block waits 0.5
// for the next (block 2's 8.5-10, 1's 10-11.5, 0's 11.5-13): the end at
// 14.
TEST(ScheduleTiming, TheVocabularysPiecesTakeTheWindowsBesideThem) {
  for (const auto& [pieces, end, backward_waits] :
       {std::tuple{1, 12.5, 3 * 0.5}, std::tuple{2, 14.0, 1.5 + 3 * 0.5}}) {
    ActionCosts c = equal(1, 4.0, 4.0);
    c.reduce = {0.5};
    c.optimizer = 0.125;
    c.block_transfers = {{0, 4, 0.0, 1.5}};
    c.block_transfers[0].head_pieces = pieces;
    const SimulatedStep s = simulate_step(ScheduleKind::kOneFOneB, 1, 1, c);
    EXPECT_EQ(s.step_time, end + 0.625) << pieces << " piece(s)";
    EXPECT_EQ(s.reduction_waits, std::vector<double>{1.5 + 3 * 0.5 + backward_waits})
        << pieces << " piece(s)";
  }
}

// The weights the last step's AdamW updated, gathered from the step's
// start in the order the forward uses them, worked by hand: one stage of
// two blocks, F and B 1 s a block, no reduce-scatters (zero 1), the
// embedding's gather 0.5 s, a block's 1.5 s, the head's 0.25 s. F0 waits
// for the embedding's (to 0.5), block 0's (to 2) and block 1's (to 3.5),
// and ends at 4.5 with the head's in (3.75); nothing later waits: B0
// 4.5-6.5, F1 6.5-8.5, B1 8.5-10.5, the reduction 10.5-11. With the
// head's 3 s it ends at 6.5 (the head's gather), and the rest 2 s later.
TEST(ScheduleTiming, TheWeightsAfterAdamWArriveInTheOrderTheForwardUsesThem) {
  ActionCosts c = equal(1, 2.0, 2.0);
  c.reduce = {0.5};
  c.optimizer = 0.125;
  c.block_transfers = {{0, 2, 0.0, 0.0, 1.5}};
  c.published = {{0.5, 0.25}};
  SimulatedStep s = simulate_step(ScheduleKind::kOneFOneB, 1, 2, c);
  EXPECT_EQ(s.step_time, 11.125);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{0.5 + 1.5 + 0.5});
  EXPECT_EQ(s.compute[0], 8.0);
  c.published = {{0.5, 3.0}};
  s = simulate_step(ScheduleKind::kOneFOneB, 1, 2, c);
  EXPECT_EQ(s.step_time, 13.125);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{0.5 + 1.5 + 0.5 + 2});
  c.published = {{0.5, 3.0}, {0, 0}};
  EXPECT_THROW(simulate_step(ScheduleKind::kOneFOneB, 1, 2, c), std::invalid_argument);
}

// Zero 1's reduce-scatters, worked by hand: the stage's gradients are
// summed over the micro-batches, so each block's goes once, after its
// last micro-batch's backward (3 s, no window to wait for), and the
// tensors outside the blocks with them: those after the blocks (the
// head's, 0.5 s) as that backward starts, those before them (the
// embedding's, 1 s) as it ends. One stage, F and B 1 s a block, two
// blocks, 1F1B: F0 0-2, B0 2-4 (nothing), F1 4-6, B1 6-8: the head's
// 6-6.5, block 1's 7-10, block 0's 10-13, the embedding's 13-14; the
// reduction waits from 8 to 14.
TEST(ScheduleTiming, ZeroOnesReductionsGoAfterTheLastMicroBatch) {
  ActionCosts c = equal(1, 2.0, 2.0);
  c.reduce = {0.5};
  c.optimizer = 0.125;
  c.block_transfers = {{0, 2, 0.0, 0.0, 0.0, 3.0}};
  c.reduced = {{1.0, 0.5}};
  SimulatedStep s = simulate_step(ScheduleKind::kOneFOneB, 1, 2, c);
  EXPECT_EQ(s.step_time, 14.625);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{6});
  EXPECT_EQ(s.compute[0], 8.0);
  // Two stages, one micro-batch (GPipe): the head and a tied copy of the
  // embedding (0.5 s each) on the last. Stage 1: F 2-4, B 4-6, the head's
  // 4-4.5, block 1's 5-8, block 0's 8-11, the copy's 11-11.5. Stage 0: B
  // 6-8, block 1's 7-10, block 0's 10-13, the embedding's 13-14; the
  // barrier at 14.5.
  c = equal(2, 2.0, 2.0);
  c.optimizer = 0.125;
  c.reduce = {0.5, 0.5};
  c.block_transfers = {{0, 2, 0.0, 0.0, 0.0, 3.0}, {0, 2, 0.0, 0.0, 0.0, 3.0}};
  c.reduced = {{1.0, 0.0}, {0.5, 0.5}};
  s = simulate_step(ScheduleKind::kGPipe, 2, 1, c);
  EXPECT_EQ(s.step_time, 14.625);
  EXPECT_EQ(s.reduction_waits, (std::vector<double>{6, 5.5}));
  c.reduced = {{1.0, 0.0}};
  EXPECT_THROW(simulate_step(ScheduleKind::kGPipe, 2, 1, c), std::invalid_argument);
}

// The embedding's and the head's parts of a pass (`lead`, `tail`) fall
// where they compute, worked by hand: one stage, zero 1, F and B 3 s each
// (the embedding 0.5 s, two blocks 1 s each, the head 0.5 s; backward the
// other way round). The gathers after AdamW: the embedding's 1 s, a
// block's 1.5 s, the head's 1.25 s (in at 1, 2.5, 4 and 5.25). F0: the
// embedding waits to 1 and computes to 1.5; block 0 waits to 2.5,
// computes to 3.5; block 1 waits to 4, computes to 5; the head waits to
// 5.25, computes to 5.75. B0 5.75-8.75, F1 8.75-11.75. B1 (the last):
// the head's backward to 12.25, its reduction 12.25-12.75; block 1 to
// 13.25, its 13.25-16.25; block 0 to 14.25, its 16.25-19.25; the
// embedding's backward to 14.75, its reduction 19.25-20.25; the step's
// reduction waits from 14.75 to 20.25. (Spread evenly, or the head
// waiting after it computes, the step ends at 20.625.)
TEST(ScheduleTiming, TheEmbeddingsAndHeadsPartsFallWhereTheyCompute) {
  ActionCosts c = equal(1, 3.0, 3.0);
  c.reduce = {0.5};
  c.optimizer = 0.125;
  ActionCosts::BlockTransfers b{0, 2, 0.0, 0.0, 1.5, 3.0};
  b.lead = {0.5, 0.5, 0};
  b.tail = {0.5, 0.5, 0};
  c.block_transfers = {b};
  c.published = {{1.0, 1.25}};
  c.reduced = {{1.0, 0.5}};
  const SimulatedStep s = simulate_step(ScheduleKind::kOneFOneB, 1, 2, c);
  EXPECT_EQ(s.step_time, 20.875);
  EXPECT_EQ(s.reduction_waits, std::vector<double>{1 + 1 + 0.5 + 0.25 + 5.5});
  EXPECT_EQ(s.compute[0], 12.0);
}

TEST(ScheduleTiming, CostsMustCoverEveryStage) {
  EXPECT_THROW(simulate_step(ScheduleKind::kGPipe, 3, 2, equal(2, 1, 1)), std::invalid_argument);
}

}  // namespace
}  // namespace mpiformer::test
