// AdamW (decoupled weight decay, Loshchilov & Hutter) in one pass over a
// contiguous range or over a stage's chunk list, and the squared norm used
// for global clipping. Weight decay is applied by chunk: biases and
// LayerNorm parameters are not decayed.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/adamw_math.hpp"
#include "common/adamw_params.hpp"
#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

namespace detail {
// One contiguous chunk; restrict lets the compiler vectorise (the four
// arrays never overlap). The arithmetic is common/adamw_math.hpp's.
// The gradients G: T, or a 16-bit type widened as read ([train] grad_dtype).
template <class T, class G>
void adamw_chunk(T* __restrict p, const G* __restrict g, T* __restrict m, T* __restrict v,
                 int64_t n, const AdamWConstants<T>& k, T wd) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], static_cast<T>(ld(g[i])), m[i], v[i], k, wd);
}
constexpr int64_t kChunk = 4096;
}  // namespace detail

// One contiguous range, every element decayed by p.weight_decay.
template <class T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, const AdamWParams& p) {
  const AdamWConstants<T> k = adamw_constants<T>(p);
  const int64_t chunks = (n + detail::kChunk - 1) / detail::kChunk;
  parallel_for("adamw_update", chunks, [=](const int64_t c) {
    const int64_t i0 = c * detail::kChunk, len = std::min(detail::kChunk, n - i0);
    detail::adamw_chunk(params + i0, grads + i0, m + i0, v + i0, len, k, k.wd);
  });
}

// A whole stage from its optimizer description (the same chunk list the GPU
// kernel consumes); p.weight_decay applies to the chunks flagged `decay`.
// With `weights` (mixed precision) each updated chunk is also rounded into
// the copy the matmuls read, while it is still in cache. Each array at its
// chunk's own offset (AdamWChunk).
// The chunks flagged `narrow` read their gradients from `grads16`.
template <class T, class A = T>
void adamw_update_chunks(T* params, const T* grads, T* m, T* v, const AdamWChunk* chunks,
                         int64_t count, const AdamWParams& p, A* weights = nullptr,
                         const A* grads16 = nullptr) {
  const AdamWConstants<T> k = adamw_constants<T>(p);
  parallel_for("adamw_update", count, [=](const int64_t c) {
    const AdamWChunk ch = chunks[c];
    const int64_t o = ch.offset;
    T* p = params + ch.param_offset;
    const T wd = ch.decay ? k.wd : T(0);
    if (ch.narrow) detail::adamw_chunk(p, grads16 + ch.grad_offset, m + o, v + o, ch.length, k, wd);
    else detail::adamw_chunk(p, grads + ch.grad_offset, m + o, v + o, ch.length, k, wd);
    if (weights != nullptr) {
      A* copy = weights + ch.copy_offset;
      for (int64_t i = 0; i < ch.length; ++i) copy[i] = st<A>(p[i]);
    }
  });
}

// Sum of squares in double: the clip threshold is compared against it, and
// double keeps the result independent of how the range is split across ranks
// up to rounding far below fp32 resolution.
template <class T>
double sum_of_squares(const T* x, int64_t n) {
  const int64_t chunks = (n + detail::kChunk - 1) / detail::kChunk;
  return parallel_sum("sum_of_squares", chunks, [=](const int64_t k) {
    const int64_t i0 = k * detail::kChunk, i1 = std::min(n, i0 + detail::kChunk);
    // Eight independent partial sums: a fixed order the compiler can keep
    // in one vector register.
    double lanes[8] = {};
    int64_t i = i0;
    // (ld: 16-bit gradients widen to float, exactly.)
    for (; i + 8 <= i1; i += 8)
      for (int j = 0; j < 8; ++j) {
        const double v = static_cast<double>(ld(x[i + j]));
        lanes[j] += v * v;
      }
    double s = 0;
    for (; i < i1; ++i) {
      const double v = static_cast<double>(ld(x[i]));
      s += v * v;
    }
    for (double l : lanes) s += l;
    return s;
  });
}

}  // namespace mpiformer::host
