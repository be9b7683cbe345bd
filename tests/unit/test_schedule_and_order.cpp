// Learning-rate schedule and sample order.
#include <set>

#include "reference.hpp"
#include "train/lr_schedule.hpp"
#include "train/sample_order.hpp"

namespace mpiformer::test {
namespace {

TEST(LearningRate, WarmupThenCosineToMinimum) {
  const double lr = 1e-3, min_lr = 1e-4;
  EXPECT_DOUBLE_EQ(learning_rate(lr, min_lr, 10, 110, 0), lr / 10);
  EXPECT_DOUBLE_EQ(learning_rate(lr, min_lr, 10, 110, 9), lr);
  EXPECT_DOUBLE_EQ(learning_rate(lr, min_lr, 10, 110, 10), lr);
  EXPECT_NEAR(learning_rate(lr, min_lr, 10, 111, 60), (lr + min_lr) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(learning_rate(lr, min_lr, 10, 110, 109), min_lr);
  for (int s = 11; s < 110; ++s)
    EXPECT_LE(learning_rate(lr, min_lr, 10, 110, s), learning_rate(lr, min_lr, 10, 110, s - 1));
}

TEST(SampleOrder, EachEpochIsAPermutationAndSeedsDiffer) {
  SampleOrder a(97, 1), b(97, 1), c(97, 2);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    bool differs = false;
    for (int64_t i = 0; i < 97; ++i) {
      const int64_t pos = epoch * 97 + i;
      const int64_t w = a.window(pos);
      EXPECT_EQ(w, b.window(pos));
      differs |= w != c.window(pos);
      seen.insert(w);
    }
    EXPECT_EQ(seen.size(), 97u) << "epoch " << epoch;
    EXPECT_TRUE(differs);
  }
  // Positions can be visited in any order (a restart, another rank) with
  // the same answer.
  SampleOrder d(97, 1);
  EXPECT_EQ(d.window(250), a.window(250));
  EXPECT_EQ(d.window(3), a.window(3));
}

// A trillion-token dataset's window count costs no memory: any position is
// answered at once and inside the range, and a first stretch of positions
// spreads over the whole dataset (a shuffle, not a scan).
TEST(SampleOrder, HugeCountsAreComputedNotStored) {
  const int64_t n = 976562500;  // 10^12 tokens in windows of 1024
  SampleOrder order(n, 1337);
  EXPECT_LE(sizeof(order), 128u);
  std::set<int64_t> seen;
  int tenths[10] = {};
  for (int64_t pos = 0; pos < 20000; ++pos) {
    const int64_t w = order.window(pos);
    ASSERT_GE(w, 0);
    ASSERT_LT(w, n);
    seen.insert(w);
    ++tenths[w / (n / 10 + 1)];
  }
  EXPECT_EQ(seen.size(), 20000u);  // a permutation repeats nothing
  for (int t = 0; t < 10; ++t) EXPECT_NEAR(tenths[t], 2000, 200) << "tenth " << t;  // 4.5 sigma
  EXPECT_GE(order.window(3 * n + 5), 0);  // a later epoch, directly
}

// Counts that are not powers of four (the walk back into range) are
// permuted exactly, every epoch.
TEST(SampleOrder, EveryCountIsPermutedExactly) {
  for (const int64_t n : {1, 2, 3, 5, 17, 64, 65, 1000, 4097}) {
    SampleOrder order(n, 42);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::set<int64_t> seen;
      for (int64_t i = 0; i < n; ++i) seen.insert(order.window(epoch * n + i));
      EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "n " << n;
      EXPECT_EQ(*seen.rbegin(), n - 1);
    }
  }
}

}  // namespace
}  // namespace mpiformer::test
