// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// A: the storage type (storage_types.hpp); the arithmetic is in compute_t<A>.
#pragma once
#include <cmath>
#include <cstdint>

#include "fast_math.hpp"
#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

template <class A>
void gelu_forward(A* out, const A* inp, int64_t n) {
  using T = compute_t<A>;
  parallel_for("gelu_forward", n, [=](const int64_t i) {
    const T x = ld(inp[i]);
    const T k = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
    out[i] = st<A>(T(0.5) * x * (T(1) + tanh_fast(k * (x + T(0.044715) * x * x * x))));
  });
}

// dinp is overwritten (=): the MLP's pre-activation has one consumer.
template <class A>
void gelu_backward(A* dinp, const A* inp, const A* dout, int64_t n) {
  using T = compute_t<A>;
  parallel_for("gelu_backward", n, [=](const int64_t i) {
    const T x = ld(inp[i]);
    const T k = static_cast<T>(0.7978845608028654);
    const T u = k * (x + T(0.044715) * x * x * x);
    const T th = tanh_fast(u);
    const T sech2 = T(1) - th * th;
    const T du = k * (T(1) + T(3) * T(0.044715) * x * x);
    dinp[i] = st<A>(ld(dout[i]) * (T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * du));
  });
}

}  // namespace mpiformer::host
