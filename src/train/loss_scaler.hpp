// fp16's loss scaling, with the semantics of PyTorch's GradScaler: the loss
// (in practice dloss/dlogits) is multiplied by the scale before backward so
// small gradients survive fp16's narrow range, and the gradients are divided
// by it before clipping and AdamW. Dynamic scaling starts at 2^16; a step
// whose gradients hold an inf or NaN is an overflow: its update is skipped
// and the scale halves; after `window` consecutive steps without one the
// scale doubles. A fixed scale never changes, and its overflows are left to
// the nonfinite policy (train/step_guard.hpp), as every non-finite value
// the scaler does not explain (a non-finite loss) is.
//
// Every rank decides from the same all-reduced gradient norm, so all skip
// the same steps and hold the same scale without communicating.
#pragma once
#include <cstdint>
#include <string>

#include "deck.hpp"

namespace mpiformer {

class LossScaler {
 public:
  static constexpr double kInitialScale = 65536.0;  // 2^16, GradScaler's default
  static constexpr double kGrowth = 2.0, kBackoff = 0.5;

  // No scaling (fp32, bf16): scale 1, never an overflow.
  LossScaler() = default;
  LossScaler(bool dynamic, double scale, int64_t window, double min_scale);
  // The deck's scaler: dynamic or fixed for fp16, none otherwise.
  static LossScaler from_deck(const TrainConfig& tc);

  bool active() const { return active_; }
  bool dynamic() const { return dynamic_; }
  double scale() const { return scale_; }

  enum class Verdict {
    kApply,     // finite gradients (or no dynamic scaling): the update is the guard's to judge
    kOverflow,  // skip the update; the scale has backed off
    kTooSmall,  // an overflow that would take the scale below the minimum: the run stops
  };
  // After a step's all-reduced gradient norm (of the scaled gradients) is
  // known: updates the scale as GradScaler's update() does.
  Verdict after_step(bool grads_finite);
  // Why the last verdict was not kApply.
  const std::string& why() const { return why_; }
  int64_t overflows() const { return overflows_; }

  // Exact resume: the scale and the steps since the last overflow or
  // growth (GradScaler's growth tracker).
  struct State {
    double scale = kInitialScale;
    int64_t good_steps = 0;
  };
  State state() const { return {scale_, good_steps_}; }
  void restore(const State& s);

 private:
  bool active_ = false, dynamic_ = false;
  double scale_ = 1.0;
  int64_t window_ = 2000;
  double min_scale_ = 1.0;
  int64_t good_steps_ = 0, overflows_ = 0;
  std::string why_;
};

}  // namespace mpiformer
