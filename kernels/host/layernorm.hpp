// LayerNorm over the last dimension, eps 1e-5 (GPT-2).
// Layout: inp/out [N,C], weight/bias [C], mean/rstd [N] saved for backward.
#pragma once
#include <cmath>
#include <cstdint>

#include "column_sums.hpp"
#include "common/op_constants.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C) {
  parallel_for("layernorm_forward", N, [=](const int64_t n) {
    const T* x = inp + n * C;
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= static_cast<T>(C);
    T v = 0;
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<T>(C);
    const T s = T(1) / std::sqrt(v + static_cast<T>(kLayerNormEps));
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  });
}

// dinp is ACCUMULATED (+=): LayerNorm always reads the residual stream, whose
// gradient already holds the gradient that flowed around the block; adding
// into it is the residual connection's backward. dweight/dbias accumulate
// across micro-batches like every parameter gradient.
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int64_t N, int64_t C) {
  parallel_for("layernorm_backward_input", N, [=](const int64_t n) {
    const T* x = inp + n * C;
    const T* g = dout + n * C;
    const T m = mean[n], s = rstd[n];
    T sum_g = 0, sum_gx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const T gn = g[c] * weight[c];
      sum_g += gn;
      sum_gx += gn * (x[c] - m) * s;
    }
    sum_g /= static_cast<T>(C);
    sum_gx /= static_cast<T>(C);
    T* d = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const T xhat = (x[c] - m) * s;
      d[c] += s * (g[c] * weight[c] - sum_g - xhat * sum_gx);
    }
  });
  // Parameter gradients: column blocks with rows in order inside (see
  // column_sums.hpp): fixed summation order, contiguous inner loop.
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  parallel_for("layernorm_backward_params", blocks, [=](const int64_t blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    T dw[kColumnBlock] = {}, db[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const T* g = dout + n * C;
      const T* x = inp + n * C;
      const T m = mean[n], s = rstd[n];
      for (int64_t c = c0; c < c1; ++c) {
        dw[c - c0] += g[c] * (x[c] - m) * s;
        db[c - c0] += g[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dweight[c] += dw[c - c0];
      dbias[c] += db[c - c0];
    }
  });
}

}  // namespace mpiformer::host
