#include "train/loss_scaler.hpp"

#include <algorithm>

#include "core/format.hpp"

namespace mpiformer {

LossScaler::LossScaler(bool dynamic, double scale, int64_t window, double min_scale)
    : active_(true), dynamic_(dynamic), scale_(scale), window_(window), min_scale_(min_scale) {}

LossScaler LossScaler::from_deck(const TrainConfig& tc) {
  if (tc.precision != Precision::kFp16) return LossScaler();
  const bool dynamic = tc.loss_scale == 0;
  return LossScaler(dynamic, dynamic ? kInitialScale : tc.loss_scale, tc.loss_scale_window,
                    tc.min_loss_scale);
}

LossScaler::Verdict LossScaler::after_step(bool grads_finite) {
  why_.clear();
  if (!dynamic_) return Verdict::kApply;
  if (grads_finite) {
    if (++good_steps_ == window_) {
      scale_ = std::min(scale_ * kGrowth, kMaxLossScale);  // deck.hpp: fp16's useful range
      good_steps_ = 0;
    }
    return Verdict::kApply;
  }
  ++overflows_;
  good_steps_ = 0;
  const double backed_off = scale_ * kBackoff;
  if (backed_off < min_scale_) {
    why_ = strprintf("fp16 gradients overflow even at loss scale %g; backing off would go below "
                     "[train] min_loss_scale = %g (the run has diverged, or fp16's range is too "
                     "narrow for it: train in bf16)",
                     scale_, min_scale_);
    return Verdict::kTooSmall;
  }
  why_ = strprintf("fp16 overflow: loss scale %g -> %g", scale_, backed_off);
  scale_ = backed_off;
  return Verdict::kOverflow;
}

void LossScaler::restore(const State& s) {
  scale_ = s.scale;
  good_steps_ = s.good_steps;
}

}  // namespace mpiformer
