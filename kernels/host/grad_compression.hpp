// The compressed all-reduce's three kernels on the host (CUDA twin:
// cuda/grad_compression.cu; format and arithmetic: common/grad_compression.hpp).
// Each works block by block (kQuantBlock elements), in parallel.
//   compress: x = g + residual for n elements cut into `parts` chunks of c,
//     each chunk compressed into its place in `wire`, residual = x - D(Q(x));
//   sum: the `parts` chunks of c (one per rank) in `wire`, of which the
//     first `valid` elements count, summed in rank order with the residual,
//     the sum compressed into `out` (residual = sum - D(Q(sum)));
//   expand: the `parts` chunks in `wire` into n floats.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/grad_compression.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

namespace detail {

// Block b (kQuantBlock elements of a chunk, `len` of them valid) of the
// values x(i) compressed at `chunk`, each element's leftover to left(i, r).
template <class X, class Left>
void compress_block(bool int8, uint8_t* chunk, int64_t c, int64_t b, int64_t len, const X& x,
                    const Left& left) {
  const int64_t first = b * kQuantBlock;
  const int64_t end = std::min(c, first + kQuantBlock);
  if (!int8) {
    auto* q = reinterpret_cast<uint16_t*>(chunk) + first;
    for (int64_t i = first; i < end; ++i) {
      const float v = i < len ? x(i) : 0.0f;
      q[i - first] = float_to_bf16(v);
      if (i < len) left(i, v - bf16_to_float(q[i - first]));
    }
    if (end == c)
      for (int64_t i = c; i < c + chunk_padding(false, c); ++i) q[i - first] = 0;
    return;
  }
  float amax = 0;
  bool finite = true;
  for (int64_t i = first; i < std::min(end, len); ++i) {
    const float v = x(i);
    finite = finite && std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  const float scale = gc_scale(amax, finite);
  reinterpret_cast<float*>(chunk)[b] = scale;
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  auto* q = reinterpret_cast<int8_t*>(chunk + 4 * blocks);
  for (int64_t i = first; i < end; ++i) {
    const float v = i < len ? x(i) : 0.0f;
    q[i] = gc_to_int8(v, scale);
    if (i < len) left(i, gc_int8_left(v, q[i], scale));
  }
  if (end == c)
    for (int64_t i = c; i < c + chunk_padding(true, c); ++i) q[i] = 0;
}

// Element i of a compressed chunk.
inline float expand_element(bool int8, const uint8_t* chunk, int64_t c, int64_t i) {
  if (!int8) return bf16_to_float(reinterpret_cast<const uint16_t*>(chunk)[i]);
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  const float scale = reinterpret_cast<const float*>(chunk)[i / kQuantBlock];
  return gc_int8_add(0.0f, reinterpret_cast<const int8_t*>(chunk + 4 * blocks)[i], scale);
}

}  // namespace detail

inline void compress_with_feedback(bool int8, const float* g, float* residual, int64_t n,
                                   int parts, uint8_t* wire) {
  const int64_t c = chunk_elements(n, parts), bytes = compressed_chunk_bytes(int8, c);
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  parallel_for("compress_with_feedback", parts * blocks, [=](int64_t job) {
    const int64_t k = job / blocks, b = job % blocks;
    const int64_t at = k * c, len = std::max<int64_t>(0, std::min(c, n - at));
    detail::compress_block(
        int8, wire + k * bytes, c, b, len, [&](int64_t i) { return g[at + i] + residual[at + i]; },
        [&](int64_t i, float r) { residual[at + i] = r; });
  });
}

inline void sum_compressed(bool int8, const uint8_t* wire, int parts, int64_t c, int64_t valid,
                           float* residual, uint8_t* out) {
  const int64_t bytes = compressed_chunk_bytes(int8, c);
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  parallel_for("sum_compressed", blocks, [=](int64_t b) {
    auto sum = [&](int64_t i) {
      float s = 0;
      for (int j = 0; j < parts; ++j) s += detail::expand_element(int8, wire + j * bytes, c, i);
      return s + residual[i];
    };
    detail::compress_block(int8, out, c, b, valid, sum, [&](int64_t i, float r) { residual[i] = r; });
  });
}

inline void expand_compressed(bool int8, const uint8_t* wire, int parts, int64_t n, float* out) {
  const int64_t c = chunk_elements(n, parts), bytes = compressed_chunk_bytes(int8, c);
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  parallel_for("expand_compressed", parts * blocks, [=](int64_t job) {
    const int64_t k = job / blocks, b = job % blocks;
    const int64_t at = k * c, len = std::max<int64_t>(0, std::min(c, n - at));
    for (int64_t i = b * kQuantBlock; i < std::min(len, (b + 1) * kQuantBlock); ++i)
      out[at + i] = detail::expand_element(int8, wire + k * bytes, c, i);
  });
}

}  // namespace mpiformer::host
