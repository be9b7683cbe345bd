// One AdamW element update, written once for every placement of the
// optimizer state: the host kernel (host/adamw.hpp), the CUDA kernel
// (cuda/adamw.cu) and the host step over state streamed from host memory
// or NVMe (train/adamw_state.hpp) all call it, so where the state lives
// never changes a bit of the result.
//
// Every sum of a product is an explicit fused multiply-add. A compiler may
// fuse `a * b + c` or not (GCC does under -march=native even in ISO mode,
// nvcc does by default), and the two choices round differently; written as
// fma the rounding is fixed: one rounding per fma, per lone product, per
// division and per square root (all correctly rounded in IEEE arithmetic,
// on the host and on the device without --use_fast_math).
#pragma once
#include <cmath>

#include "common/adamw_params.hpp"

#if defined(__CUDACC__)
#define MPIFORMER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MPIFORMER_HOST_DEVICE inline
#endif

namespace mpiformer {

// The update's per-element constants in the state's type: the bias
// corrections folded into two (one division and one square root per
// element, not three), computed once per step in double.
template <class T>
struct AdamWConstants {
  T b1, one_minus_b1, b2, one_minus_b2, inv_c1, inv_sqrt_c2, minus_lr, eps, wd, gs;
};

template <class T>
AdamWConstants<T> adamw_constants(const AdamWParams& p) {
  const double c1 = 1.0 - std::pow(p.beta1, static_cast<double>(p.step));
  const double c2 = 1.0 - std::pow(p.beta2, static_cast<double>(p.step));
  return AdamWConstants<T>{static_cast<T>(p.beta1),
                           static_cast<T>(1.0 - p.beta1),
                           static_cast<T>(p.beta2),
                           static_cast<T>(1.0 - p.beta2),
                           static_cast<T>(1.0 / c1),
                           static_cast<T>(1.0 / std::sqrt(c2)),
                           static_cast<T>(-p.lr),
                           static_cast<T>(p.eps),
                           static_cast<T>(p.weight_decay),
                           static_cast<T>(p.grad_scale)};
}

// p, m, v updated from gradient g; `wd`: this element's decay (k.wd or 0).
template <class T>
MPIFORMER_HOST_DEVICE void adamw_element(T& p, T g, T& m, T& v, const AdamWConstants<T>& k,
                                         T wd) {
#if !defined(__CUDA_ARCH__)
  using std::fma;  // on the device, CUDA's own overloads
  using std::sqrt;
#endif
  const T gi = g * k.gs;
  const T mi = fma(k.b1, m, k.one_minus_b1 * gi);
  const T vi = fma(k.b2, v, (k.one_minus_b2 * gi) * gi);
  m = mi;
  v = vi;
  // p - lr (mhat / (sqrt(vhat) + eps) + wd p)
  const T step = fma(wd, p, (mi * k.inv_c1) / fma(sqrt(vi), k.inv_sqrt_c2, k.eps));
  p = fma(k.minus_lr, step, p);
}

}  // namespace mpiformer
