// LayerNorm over the last dimension, eps 1e-5 (GPT-2).
// Layout: inp/out [N,C], weight/bias [C], mean/rstd [N] saved for backward.
// A is the storage type of activations and weights (float, double, or a
// 16-bit type: storage_types.hpp); statistics, parameter gradients and the
// arithmetic are in compute_t<A>.
#pragma once
#include <cmath>
#include <cstdint>

#include "column_sums.hpp"
#include "common/op_constants.hpp"
#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

template <class A, class F = compute_t<A>>
void layernorm_forward(A* out, F* mean, F* rstd, const A* inp, const A* weight, const A* bias,
                       int64_t N, int64_t C) {
  parallel_for("layernorm_forward", N, [=](const int64_t n) {
    const A* x = inp + n * C;
    F m = 0;
    for (int64_t c = 0; c < C; ++c) m += ld(x[c]);
    m /= static_cast<F>(C);
    F v = 0;
    for (int64_t c = 0; c < C; ++c) v += (ld(x[c]) - m) * (ld(x[c]) - m);
    v /= static_cast<F>(C);
    const F s = F(1) / std::sqrt(v + static_cast<F>(kLayerNormEps));
    A* o = out + n * C;
    for (int64_t c = 0; c < C; ++c)
      o[c] = st<A>((ld(x[c]) - m) * s * ld(weight[c]) + ld(bias[c]));
    mean[n] = m;
    rstd[n] = s;
  });
}

// dinp is ACCUMULATED (+=): LayerNorm always reads the residual stream, whose
// gradient already holds the gradient that flowed around the block; adding
// into it is the residual connection's backward. dweight/dbias accumulate
// across micro-batches like every parameter gradient.
template <class A, class F = compute_t<A>>
void layernorm_backward(A* dinp, F* dweight, F* dbias, const A* dout, const A* inp,
                        const A* weight, const F* mean, const F* rstd, int64_t N, int64_t C) {
  parallel_for("layernorm_backward_input", N, [=](const int64_t n) {
    const A* x = inp + n * C;
    const A* g = dout + n * C;
    const F m = mean[n], s = rstd[n];
    F sum_g = 0, sum_gx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const F gn = ld(g[c]) * ld(weight[c]);
      sum_g += gn;
      sum_gx += gn * (ld(x[c]) - m) * s;
    }
    sum_g /= static_cast<F>(C);
    sum_gx /= static_cast<F>(C);
    A* d = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const F xhat = (ld(x[c]) - m) * s;
      d[c] = st<A>(ld(d[c]) + s * (ld(g[c]) * ld(weight[c]) - sum_g - xhat * sum_gx));
    }
  });
  // Parameter gradients: column blocks with rows in order inside (see
  // column_sums.hpp): fixed summation order, contiguous inner loop.
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  parallel_for("layernorm_backward_params", blocks, [=](const int64_t blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    F dw[kColumnBlock] = {}, db[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const A* g = dout + n * C;
      const A* x = inp + n * C;
      const F m = mean[n], s = rstd[n];
      for (int64_t c = c0; c < c1; ++c) {
        dw[c - c0] += ld(g[c]) * (ld(x[c]) - m) * s;
        db[c - c0] += ld(g[c]);
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dweight[c] += dw[c - c0];
      dbias[c] += db[c - c0];
    }
  });
}

}  // namespace mpiformer::host
