// SwiGLU (Llama's MLP activation): out = silu(gate) * up, silu(x) = x *
// sigmoid(x). Layout: inp [N, 2F] (each row: F gate values, then F up
// values, as the fused gate/up projection writes them), out [N, F].
// A: the storage type (storage_types.hpp); the arithmetic is in compute_t<A>.
#pragma once
#include <cmath>
#include <cstdint>

#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

template <class A>
void swiglu_forward(A* out, const A* inp, int64_t N, int64_t F) {
  using T = compute_t<A>;
  parallel_for("swiglu_forward", N, [=](const int64_t n) {
    const A* g = inp + n * 2 * F;
    const A* u = g + F;
    A* o = out + n * F;
    for (int64_t i = 0; i < F; ++i) {
      const T x = ld(g[i]);
      o[i] = st<A>(x / (T(1) + std::exp(-x)) * ld(u[i]));
    }
  });
}

// dinp [N, 2F] is overwritten (=): the projection's output has one
// consumer. Each element pair is read before it is written, so dinp may be
// inp itself (split backward keeps the gradient where the input was).
template <class A>
void swiglu_backward(A* dinp, const A* inp, const A* dout, int64_t N, int64_t F) {
  using T = compute_t<A>;
  parallel_for("swiglu_backward", N, [=](const int64_t n) {
    const A* g = inp + n * 2 * F;
    const A* d = dout + n * F;
    A* dg = dinp + n * 2 * F;
    for (int64_t i = 0; i < F; ++i) {
      const T x = ld(g[i]), up = ld(g[F + i]), dy = ld(d[i]);
      const T sig = T(1) / (T(1) + std::exp(-x));
      const T silu = x * sig;
      dg[i] = st<A>(dy * up * sig * (T(1) + x * (T(1) - sig)));
      dg[F + i] = st<A>(dy * silu);
    }
  });
}

}  // namespace mpiformer::host
