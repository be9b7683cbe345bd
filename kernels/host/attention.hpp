// Causal multi-head self-attention from a fused qkv projection.
// Layout: qkv [B,T,3C] (q, then k, then v; head h uses channels h*hs.. of each),
// out [B,T,C] (heads side by side), att [B,NH,T,T] softmax probabilities
// (saved for backward; entries above the diagonal are zero).
// The products run as per-(batch, head) GEMMs with strided leading dimensions,
// so no transposed copies of q, k or v are made. The full T x T score matrix is
// computed and masked: twice the causal FLOPs, but in BLAS rather than loops.
//
// With a 16-bit storage type A (storage_types.hpp) each (batch, head) first
// widens its q, k, v (and dout) slices into float scratch, the products and
// the softmax run in float, the probabilities are kept in float, and only
// out and dqkv are rounded to A, once.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gemm.hpp"
#include "fast_math.hpp"
#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

namespace detail {
// rows x hs of a strided A matrix into a dense float one, and back.
template <class A>
void widen_rows(float* dst, const A* src, int64_t rows, int64_t hs, int64_t ld_src) {
  for (int64_t r = 0; r < rows; ++r) widen_n(dst + r * hs, src + r * ld_src, hs);
}
template <class A>
void narrow_rows(A* dst, const float* src, int64_t rows, int64_t hs, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) narrow_n(dst + r * ld_dst, src + r * hs, hs);
}
// Per-thread scratch of at least n floats.
inline float* attention_scratch(int64_t n) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}
}  // namespace detail

template <class A, std::enable_if_t<kNarrow<A>, int> = 0>
void attention_forward(A* out, float* att, const A* qkv, int64_t B, int64_t Tn, int64_t C,
                       int64_t NH) {
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  parallel_for("attention_forward", B * NH, [=](const int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const A* base = qkv + b * Tn * 3 * C + h * hs;
    float* q = detail::attention_scratch(4 * Tn * hs);
    float *k = q + Tn * hs, *v = k + Tn * hs, *o = v + Tn * hs;
    detail::widen_rows(q, base, Tn, hs, 3 * C);
    detail::widen_rows(k, base + C, Tn, hs, 3 * C);
    detail::widen_rows(v, base + 2 * C, Tn, hs, 3 * C);
    float* a = att + bh * Tn * Tn;
    gemm(false, true, Tn, Tn, hs, scale, q, hs, k, hs, 0.0f, a, Tn);
    for (int64_t t = 0; t < Tn; ++t) {
      float* row = a + t * Tn;
      float mx = row[0];
      for (int64_t j = 1; j <= t; ++j) mx = row[j] > mx ? row[j] : mx;
      float sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        row[j] = exp_fast(row[j] - mx);
        sum += row[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
      for (int64_t j = t + 1; j < Tn; ++j) row[j] = 0.0f;
    }
    gemm(false, false, Tn, hs, Tn, 1.0f, a, Tn, v, hs, 0.0f, o, hs);
    detail::narrow_rows(out + b * Tn * C + h * hs, o, Tn, hs, C);
  });
}

template <class A, std::enable_if_t<kNarrow<A>, int> = 0>
void attention_backward(A* dqkv, float* datt, const A* dout, const A* qkv, const float* att,
                        int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  parallel_for("attention_backward", B * NH, [=](const int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const A* base = qkv + b * Tn * 3 * C + h * hs;
    float* q = detail::attention_scratch(7 * Tn * hs);
    float *k = q + Tn * hs, *v = k + Tn * hs, *g = v + Tn * hs;
    float *dq = g + Tn * hs, *dk = dq + Tn * hs, *dv = dk + Tn * hs;
    detail::widen_rows(q, base, Tn, hs, 3 * C);
    detail::widen_rows(k, base + C, Tn, hs, 3 * C);
    detail::widen_rows(v, base + 2 * C, Tn, hs, 3 * C);
    detail::widen_rows(g, dout + b * Tn * C + h * hs, Tn, hs, C);
    const float* a = att + bh * Tn * Tn;
    float* da = datt + bh * Tn * Tn;
    gemm(false, true, Tn, Tn, hs, 1.0f, g, hs, v, hs, 0.0f, da, Tn);  // dA = dO V^T
    gemm(true, false, Tn, hs, Tn, 1.0f, a, Tn, g, hs, 0.0f, dv, hs);  // dV = A^T dO
    for (int64_t t = 0; t < Tn; ++t) {
      const float* ar = a + t * Tn;
      float* dr = da + t * Tn;
      float dot = 0;
      for (int64_t j = 0; j <= t; ++j) dot += ar[j] * dr[j];
      for (int64_t j = 0; j <= t; ++j) dr[j] = scale * ar[j] * (dr[j] - dot);
      for (int64_t j = t + 1; j < Tn; ++j) dr[j] = 0.0f;
    }
    gemm(false, false, Tn, hs, Tn, 1.0f, da, Tn, k, hs, 0.0f, dq, hs);  // dQ = dS K
    gemm(true, false, Tn, hs, Tn, 1.0f, da, Tn, q, hs, 0.0f, dk, hs);   // dK = dS^T Q
    A* d = dqkv + b * Tn * 3 * C + h * hs;
    detail::narrow_rows(d, dq, Tn, hs, 3 * C);
    detail::narrow_rows(d + C, dk, Tn, hs, 3 * C);
    detail::narrow_rows(d + 2 * C, dv, Tn, hs, 3 * C);
  });
}

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C,
                       int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  parallel_for("attention_forward", B * NH, [=](const int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* q = qkv + b * Tn * 3 * C + h * hs;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* a = att + bh * Tn * Tn;
    gemm(false, true, Tn, Tn, hs, scale, q, 3 * C, k, 3 * C, T(0), a, Tn);
    for (int64_t t = 0; t < Tn; ++t) {
      T* row = a + t * Tn;
      T mx = row[0];
      for (int64_t j = 1; j <= t; ++j) mx = row[j] > mx ? row[j] : mx;
      T sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        row[j] = exp_fast(row[j] - mx);
        sum += row[j];
      }
      const T inv = T(1) / sum;
      for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
      for (int64_t j = t + 1; j < Tn; ++j) row[j] = T(0);
    }
    gemm(false, false, Tn, hs, Tn, T(1), a, Tn, v, 3 * C, T(0), out + b * Tn * C + h * hs, C);
  });
}

// One query against cached keys and values (incremental decoding): qkv holds
// rows 0..n-1 of [n,3C] as attention_forward lays them out; out[C] receives
// the attention of row n-1 (the newest) over rows 0..n-1. `scores` is
// scratch of n elements. The same arithmetic as a row of attention_forward.
template <class T>
void attention_forward_last(T* out, T* scores, const T* qkv, int64_t n, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t h = 0; h < NH; ++h) {
    const T* q = qkv + (n - 1) * 3 * C + h * hs;
    T mx = T(0);
    for (int64_t j = 0; j < n; ++j) {
      const T* k = qkv + j * 3 * C + C + h * hs;
      T dot = T(0);
      for (int64_t c = 0; c < hs; ++c) dot += q[c] * k[c];
      scores[j] = scale * dot;
      mx = j == 0 || scores[j] > mx ? scores[j] : mx;
    }
    T sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      scores[j] = exp_fast(scores[j] - mx);
      sum += scores[j];
    }
    const T inv = T(1) / sum;
    T* o = out + h * hs;
    for (int64_t c = 0; c < hs; ++c) o[c] = T(0);
    for (int64_t j = 0; j < n; ++j) {
      const T p = scores[j] * inv;
      const T* v = qkv + j * 3 * C + 2 * C + h * hs;
      for (int64_t c = 0; c < hs; ++c) o[c] += p * v[c];
    }
  }
}

// dqkv is overwritten (=); datt is scratch of the size of att.
template <class T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att, int64_t B,
                        int64_t Tn, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  parallel_for("attention_backward", B * NH, [=](const int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* q = qkv + b * Tn * 3 * C + h * hs;
    const T* k = q + C;
    const T* v = q + 2 * C;
    T* dq = dqkv + b * Tn * 3 * C + h * hs;
    T* dk = dq + C;
    T* dv = dq + 2 * C;
    const T* a = att + bh * Tn * Tn;
    const T* g = dout + b * Tn * C + h * hs;
    T* da = datt + bh * Tn * Tn;
    gemm(false, true, Tn, Tn, hs, T(1), g, C, v, 3 * C, T(0), da, Tn);  // dA = dO V^T
    gemm(true, false, Tn, hs, Tn, T(1), a, Tn, g, C, T(0), dv, 3 * C);  // dV = A^T dO
    // Softmax backward in place: dS = A * (dA - rowsum(A * dA)), times the
    // score scale; zero above the diagonal so the GEMMs below stay causal.
    for (int64_t t = 0; t < Tn; ++t) {
      const T* ar = a + t * Tn;
      T* dr = da + t * Tn;
      T dot = 0;
      for (int64_t j = 0; j <= t; ++j) dot += ar[j] * dr[j];
      for (int64_t j = 0; j <= t; ++j) dr[j] = scale * ar[j] * (dr[j] - dot);
      for (int64_t j = t + 1; j < Tn; ++j) dr[j] = T(0);
    }
    gemm(false, false, Tn, hs, Tn, T(1), da, Tn, k, 3 * C, T(0), dq, 3 * C);  // dQ = dS K
    gemm(true, false, Tn, hs, Tn, T(1), da, Tn, q, 3 * C, T(0), dk, 3 * C);   // dK = dS^T Q
  });
}

}  // namespace mpiformer::host
