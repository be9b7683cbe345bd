// Learning rate: linear warm-up from lr/warmup to lr over warmup_steps, then
// cosine decay to min_lr at the last step.
#pragma once
#include <cmath>
#include <cstdint>

namespace mpiformer {

// `step` is 0-based; the value applies to the update made at that step.
inline double learning_rate(double lr, double min_lr, int64_t warmup_steps, int64_t steps,
                            int64_t step) {
  if (step < warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const int64_t decay_steps = steps - warmup_steps;
  if (decay_steps <= 1) return lr;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - 1);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * std::min(progress, 1.0)));
  return min_lr + (lr - min_lr) * cosine;
}

}  // namespace mpiformer
