#include "train/step_guard.hpp"

#include <cmath>

#include "core/format.hpp"

namespace mpiformer {

StepGuard::StepGuard(NonfinitePolicy nonfinite, double spike_zscore, int64_t skip_limit)
    : nonfinite_(nonfinite), spike_zscore_(spike_zscore), skip_limit_(skip_limit) {}

void StepGuard::Window::add(double x) {
  values.push_back(x);
  if (values.size() > static_cast<size_t>(kWindow)) values.pop_front();
}

double StepGuard::Window::zscore(double x) const {
  if (values.size() < static_cast<size_t>(kWarmup)) return 0.0;
  double mean = 0;
  for (double v : values) mean += v;
  mean /= static_cast<double>(values.size());
  double var = 0;
  for (double v : values) var += (v - mean) * (v - mean);
  const double sd = std::sqrt(var / static_cast<double>(values.size()));
  return sd > 0 ? (x - mean) / sd : 0.0;
}

StepVerdict StepGuard::judge(double loss, double grad_norm) {
  why_.clear();
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    why_ = std::isfinite(loss) ? strprintf("grad norm %g", grad_norm) : strprintf("loss %g", loss);
    if (nonfinite_ == NonfinitePolicy::kStop) return StepVerdict::kStop;
  } else if (spike_zscore_ > 0) {
    const double zl = loss_.zscore(loss), zn = norm_.zscore(grad_norm);
    if (zl > spike_zscore_) why_ = strprintf("loss spike: z = %.1f", zl);
    else if (zn > spike_zscore_) why_ = strprintf("grad norm spike: z = %.1f", zn);
  }
  if (why_.empty()) {
    consecutive_ = 0;
    zero_run_ = grad_norm == 0 ? zero_run_ + 1 : 0;
    loss_.add(loss);
    norm_.add(grad_norm);
    return StepVerdict::kApply;
  }
  ++skipped_;
  if (++consecutive_ >= skip_limit_) {
    why_ = strprintf("%lld consecutive updates skipped (last: %s)",
                     static_cast<long long>(consecutive_), why_.c_str());
    return StepVerdict::kStop;
  }
  return StepVerdict::kSkip;
}

}  // namespace mpiformer
