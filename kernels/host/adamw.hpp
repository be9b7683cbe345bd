// AdamW (decoupled weight decay, Loshchilov & Hutter) in one pass over a
// contiguous parameter range, and the squared norm used for global clipping.
// Weight decay is applied by range: the caller passes 0 for biases and
// LayerNorm parameters.
#pragma once
#include <cmath>
#include <cstdint>

#include "parallel.hpp"

namespace mpiformer::host {

struct AdamWParams {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int64_t step;        // 1-based, for bias correction
  double grad_scale;   // multiplies every gradient first (clipping)
};

template <class T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, const AdamWParams& p) {
  const T b1 = static_cast<T>(p.beta1), b2 = static_cast<T>(p.beta2);
  const T c1 = static_cast<T>(1.0 - std::pow(p.beta1, static_cast<double>(p.step)));
  const T c2 = static_cast<T>(1.0 - std::pow(p.beta2, static_cast<double>(p.step)));
  const T lr = static_cast<T>(p.lr), eps = static_cast<T>(p.eps);
  const T wd = static_cast<T>(p.weight_decay), gs = static_cast<T>(p.grad_scale);
  parallel_for("adamw_update", n, [=](const int64_t i) {
    const T g = grads[i] * gs;
    const T mi = b1 * m[i] + (T(1) - b1) * g;
    const T vi = b2 * v[i] + (T(1) - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const T mhat = mi / c1, vhat = vi / c2;
    params[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * params[i]);
  });
}

// Sum of squares in double: the clip threshold is compared against it, and
// double keeps the result independent of how the range is split across ranks
// up to rounding far below fp32 resolution.
template <class T>
double sum_of_squares(const T* x, int64_t n) {
  return parallel_sum("sum_of_squares", n, [=](const int64_t i) {
    const double d = static_cast<double>(x[i]);
    return d * d;
  });
}

}  // namespace mpiformer::host
