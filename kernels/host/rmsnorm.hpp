// RMSNorm over the last dimension (Llama): out = x / rms(x) * weight,
// rms(x) = sqrt(mean(x^2) + eps). No mean is subtracted and there is no
// bias. Layout: inp/out [N,C], weight [C], rstd [N] saved for backward.
// A is the storage type of activations and weights (storage_types.hpp);
// the statistics, parameter gradients and arithmetic are in compute_t<A>.
#pragma once
#include <cmath>
#include <cstdint>

#include "column_sums.hpp"
#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

template <class A, class F = compute_t<A>>
void rmsnorm_forward(A* out, F* rstd, const A* inp, const A* weight, int64_t N, int64_t C,
                     double eps) {
  parallel_for("rmsnorm_forward", N, [=](const int64_t n) {
    const A* x = inp + n * C;
    F ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += ld(x[c]) * ld(x[c]);
    const F s = F(1) / std::sqrt(ss / static_cast<F>(C) + static_cast<F>(eps));
    A* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = st<A>(ld(x[c]) * s * ld(weight[c]));
    rstd[n] = s;
  });
}

// dinp is ACCUMULATED (+=), as LayerNorm's (the residual connection's
// backward); dweight accumulates across micro-batches. With g = dout *
// weight and xhat = x * rstd: dx = rstd * (g - xhat * mean(g * xhat)).
template <class A, class F = compute_t<A>>
void rmsnorm_backward(A* dinp, F* dweight, const A* dout, const A* inp, const A* weight,
                      const F* rstd, int64_t N, int64_t C) {
  parallel_for("rmsnorm_backward_input", N, [=](const int64_t n) {
    const A* x = inp + n * C;
    const A* g = dout + n * C;
    const F s = rstd[n];
    F sum_gx = 0;
    for (int64_t c = 0; c < C; ++c) sum_gx += ld(g[c]) * ld(weight[c]) * ld(x[c]) * s;
    sum_gx /= static_cast<F>(C);
    A* d = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const F xhat = ld(x[c]) * s;
      d[c] = st<A>(ld(d[c]) + s * (ld(g[c]) * ld(weight[c]) - xhat * sum_gx));
    }
  });
  // The weight's gradient: column blocks, rows in order inside (column_sums.hpp).
  column_term_sums(dweight, N, C, [=](int64_t n, int64_t c) {
    return static_cast<F>(ld(dout[n * C + c]) * ld(inp[n * C + c]) * rstd[n]);
  });
}

}  // namespace mpiformer::host
