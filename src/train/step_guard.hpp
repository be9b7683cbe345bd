// Whether a step's update is applied: the policy for non-finite losses and
// gradient norms ([train] nonfinite) and for spikes ([train] spike_zscore,
// the approach of llm.c's outlier detector: a z-score against the recent
// applied steps). Every rank judges the same all-reduced loss and norm with
// the same history, so all reach the same verdict without communicating.
#pragma once
#include <cstdint>
#include <deque>
#include <string>

#include "core/settings.hpp"

namespace mpiformer {

enum class StepVerdict { kApply, kSkip, kStop };

class StepGuard {
 public:
  // Spikes are judged against the last kWindow applied steps, once there
  // are kWarmup of them: a z-score of too few samples is noise.
  static constexpr int kWindow = 128, kWarmup = 16;

  StepGuard(NonfinitePolicy nonfinite, double spike_zscore, int64_t skip_limit);
  StepVerdict judge(double loss, double grad_norm);
  // Why the last verdict was not kApply ("grad norm nan", "loss spike:
  // z = 7.2", "12 consecutive skips (...)").
  const std::string& why() const { return why_; }
  int64_t skipped() const { return skipped_; }
  // Applied steps in a row whose gradients were exactly zero (nothing
  // trains: in fp16, a loss scale too small for the gradients).
  int64_t zero_gradient_steps() const { return zero_run_; }
  static constexpr int64_t kZeroGradientSteps = 10;  // when the run says so

 private:
  struct Window {
    std::deque<double> values;
    void add(double x);
    // How many standard deviations x is above the mean; 0 while warming up
    // or when the window has no spread.
    double zscore(double x) const;
  };
  NonfinitePolicy nonfinite_;
  double spike_zscore_;
  int64_t skip_limit_;
  Window loss_, norm_;
  int64_t consecutive_ = 0, skipped_ = 0, zero_run_ = 0;
  std::string why_;
};

}  // namespace mpiformer
