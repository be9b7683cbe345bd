// The update policy against hand-made sequences: non-finite values stop or
// skip; a spike is judged by its z-score against the applied steps only
// after the warm-up; consecutive skips end the run at the limit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "train/step_guard.hpp"

namespace mpiformer::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(StepGuard, NonfiniteStopsOrSkips) {
  StepGuard stop(NonfinitePolicy::kStop, 0, 10);
  EXPECT_EQ(stop.judge(2.0, 1.0), StepVerdict::kApply);
  EXPECT_EQ(stop.judge(2.0, kNaN), StepVerdict::kStop);
  EXPECT_EQ(stop.why(), "grad norm nan");
  EXPECT_EQ(stop.judge(kInf, 1.0), StepVerdict::kStop);
  EXPECT_EQ(stop.why(), "loss inf");
  StepGuard skip(NonfinitePolicy::kSkip, 0, 3);
  EXPECT_EQ(skip.judge(kNaN, 1.0), StepVerdict::kSkip);
  EXPECT_EQ(skip.judge(2.0, 1.0), StepVerdict::kApply);  // resets the run of skips
  EXPECT_EQ(skip.judge(2.0, kNaN), StepVerdict::kSkip);
  EXPECT_EQ(skip.judge(2.0, kNaN), StepVerdict::kSkip);
  EXPECT_EQ(skip.judge(2.0, kNaN), StepVerdict::kStop);  // the third in a row
  EXPECT_NE(skip.why().find("3 consecutive updates skipped"), std::string::npos) << skip.why();
  EXPECT_EQ(skip.skipped(), 4);
}

// Applied steps whose gradients are exactly zero are counted in a row (the
// run says so at kZeroGradientSteps): one nonzero norm starts it again.
TEST(StepGuard, CountsStepsWithZeroGradients) {
  StepGuard g(NonfinitePolicy::kStop, 0, 10);
  for (int i = 0; i < 4; ++i) g.judge(2.0, 0.0);
  EXPECT_EQ(g.zero_gradient_steps(), 4);
  g.judge(2.0, 1e-30);
  EXPECT_EQ(g.zero_gradient_steps(), 0);
  for (int i = 0; i < StepGuard::kZeroGradientSteps; ++i) g.judge(2.0, 0.0);
  EXPECT_EQ(g.zero_gradient_steps(), StepGuard::kZeroGradientSteps);
}

TEST(StepGuard, SpikesByZScoreAfterTheWarmup) {
  StepGuard g(NonfinitePolicy::kStop, 3.0, 10);
  // Alternating 1.0 and 3.0: mean 2, standard deviation exactly 1.
  for (int i = 0; i < StepGuard::kWarmup - 1; ++i) {
    ASSERT_EQ(g.judge(i % 2 ? 3.0 : 1.0, 1.0), StepVerdict::kApply);
  }
  EXPECT_EQ(g.judge(100.0, 1.0), StepVerdict::kApply) << "judged before the warm-up ended";
  // The window now holds 15 alternating values and 100: rebuild a clean one.
  StepGuard h(NonfinitePolicy::kStop, 3.0, 10);
  for (int i = 0; i < StepGuard::kWarmup; ++i) h.judge(i % 2 ? 3.0 : 1.0, 1.0 + (i % 2));
  EXPECT_EQ(h.judge(4.9, 1.5), StepVerdict::kApply);  // z = 2.9
  EXPECT_EQ(h.judge(6.0, 1.5), StepVerdict::kSkip);   // z = (6 - m) / sd > 3
  EXPECT_NE(h.why().find("loss spike"), std::string::npos) << h.why();
  EXPECT_EQ(h.judge(2.0, 50.0), StepVerdict::kSkip);
  EXPECT_NE(h.why().find("grad norm spike"), std::string::npos) << h.why();
  // Skipped steps do not enter the window: the same spike is skipped again.
  EXPECT_EQ(h.judge(6.0, 1.5), StepVerdict::kSkip);
  StepGuard off(NonfinitePolicy::kStop, 0, 10);
  for (int i = 0; i < 40; ++i) off.judge(1.0 + (i % 2), 1.0);
  EXPECT_EQ(off.judge(1e6, 1e6), StepVerdict::kApply) << "spike_zscore 0 is off";
}

}  // namespace
}  // namespace mpiformer::test
