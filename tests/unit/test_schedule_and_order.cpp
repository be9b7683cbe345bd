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

}  // namespace
}  // namespace mpiformer::test
