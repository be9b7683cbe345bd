// fp16's dynamic loss scaler against sequences worked out by hand from
// PyTorch GradScaler's rules (growth 2 after `window` clean steps, backoff
// 0.5 and the step skipped on an overflow), not from the code under test.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "train/loss_scaler.hpp"

namespace mpiformer {
namespace {

struct Trace {
  std::vector<double> used;    // the scale each step ran with
  std::vector<int> skipped;    // 1-based steps whose update was skipped
};

Trace run(LossScaler& s, int steps, const std::set<int>& overflow_at, int first = 1) {
  Trace t;
  for (int step = first; step < first + steps; ++step) {
    t.used.push_back(s.scale());
    const auto v = s.after_step(overflow_at.count(step) == 0);
    if (v != LossScaler::Verdict::kApply) t.skipped.push_back(step);
  }
  return t;
}

TEST(LossScaler, FollowsGradScalersSequence) {
  LossScaler s(true, LossScaler::kInitialScale, 3, 1.0);
  const Trace t = run(s, 11, {2, 6, 7});
  const std::vector<double> want = {65536, 65536, 32768, 32768, 32768, 65536,
                                    32768, 16384, 16384, 16384, 32768};
  EXPECT_EQ(t.used, want);
  EXPECT_EQ(t.skipped, (std::vector<int>{2, 6, 7}));
  EXPECT_EQ(s.overflows(), 3);
  EXPECT_EQ(s.scale(), 32768);
}

TEST(LossScaler, GrowsOnlyAfterAWholeWindow) {
  LossScaler s(true, 8.0, 2000, 1.0);
  const Trace t = run(s, 4001, {});
  EXPECT_EQ(t.used[1999], 8.0);
  EXPECT_EQ(t.used[2000], 16.0);  // step 2001 runs at the grown scale
  EXPECT_EQ(t.used[4000], 32.0);
  EXPECT_TRUE(t.skipped.empty());
}

// The scale grows to 2^24 and no further: above, a sane model's fp16
// gradients overflow anyway (deck.hpp's kMaxLossScale).
TEST(LossScaler, GrowthStopsAtTheTopOfFp16sUsefulRange) {
  LossScaler s(true, 0x1p23, 1, 1.0);
  s.after_step(true);
  EXPECT_EQ(s.scale(), 0x1p24);
  s.after_step(true);
  s.after_step(true);
  EXPECT_EQ(s.scale(), 0x1p24);
}

TEST(LossScaler, StopsBelowTheMinimum) {
  LossScaler s(true, 4.0, 100, 1.0);
  EXPECT_EQ(s.after_step(false), LossScaler::Verdict::kOverflow);  // 4 -> 2
  EXPECT_EQ(s.after_step(false), LossScaler::Verdict::kOverflow);  // 2 -> 1
  EXPECT_EQ(s.after_step(false), LossScaler::Verdict::kTooSmall);  // 1 -> 0.5 < 1
  EXPECT_NE(s.why().find("min_loss_scale"), std::string::npos) << s.why();
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, AFixedScaleNeverMovesAndLeavesOverflowsToTheGuard) {
  LossScaler s(false, 1024.0, 3, 1.0);
  EXPECT_TRUE(s.active());
  const Trace t = run(s, 10, {1, 2, 3, 4});
  EXPECT_EQ(t.used, std::vector<double>(10, 1024.0));
  EXPECT_TRUE(t.skipped.empty());
  const LossScaler none;
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.scale(), 1.0);
}

TEST(LossScaler, ResumesExactlyFromItsState) {
  LossScaler whole(true, LossScaler::kInitialScale, 3, 1.0);
  const Trace all = run(whole, 12, {2, 9});
  LossScaler first(true, LossScaler::kInitialScale, 3, 1.0);
  const Trace a = run(first, 4, {2});
  LossScaler second(true, LossScaler::kInitialScale, 3, 1.0);
  second.restore(first.state());
  const Trace b = run(second, 8, {2, 9}, 5);
  std::vector<double> joined = a.used;
  joined.insert(joined.end(), b.used.begin(), b.used.end());
  EXPECT_EQ(joined, all.used);
}

TEST(LossScaler, FromTheDeck) {
  TrainConfig tc;
  EXPECT_FALSE(LossScaler::from_deck(tc).active());
  tc.precision = Precision::kBf16;
  EXPECT_FALSE(LossScaler::from_deck(tc).active());
  tc.precision = Precision::kFp16;
  const LossScaler d = LossScaler::from_deck(tc);
  EXPECT_TRUE(d.dynamic());
  EXPECT_EQ(d.scale(), 65536.0);
  tc.loss_scale = 128;
  const LossScaler f = LossScaler::from_deck(tc);
  EXPECT_TRUE(f.active() && !f.dynamic());
  EXPECT_EQ(f.scale(), 128.0);
}

}  // namespace
}  // namespace mpiformer
