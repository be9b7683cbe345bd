// Causal multi-head self-attention from a fused qkv projection.
// Layout: qkv [B,T,3C] (q, then k, then v; head h uses channels h*hs.. of each),
// out [B,T,C] (heads side by side), att [B,NH,T,T] softmax probabilities
// (saved for backward; entries above the diagonal are zero).
// The products run as per-(batch, head) GEMMs with strided leading dimensions,
// so no transposed copies of q, k or v are made. The full T x T score matrix is
// computed and masked: twice the causal FLOPs, but in BLAS rather than loops.
//
// In fp32 and fp64 the heads go one after another (each product threaded by
// the BLAS); 16-bit storage is below.
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
// Per-thread scratch of at least n elements of U.
template <class U>
U* attention_scratch(int64_t n) {
  thread_local std::vector<U> buffer;
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}
// Causal softmax in place over each row of the B*NH T x T score matrices
// (entries above the diagonal set to zero), and the probabilities rounded
// to A for the product with V.
template <class A>
void causal_softmax(float* att, A* rounded, int64_t rows, int64_t Tn) {
  parallel_for("attention_softmax", rows, [=](const int64_t r) {
    const int64_t t = r % Tn;
    float* row = att + r * Tn;
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
    narrow_n(rounded + r * Tn, row, Tn);
  });
}
}  // namespace detail

// 16-bit storage: the products take 16-bit operands and accumulate in float
// (all heads in one call, head_gemm), as the GPU's tensor cores do: the
// scores and the softmax are float, the probabilities (and in backward the
// score gradients) are rounded to A for the products that read them.
template <class A, std::enable_if_t<kNarrow<A>, int> = 0>
void attention_forward(A* out, float* att, const A* qkv, int64_t B, int64_t Tn, int64_t C,
                       int64_t NH) {
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const HeadStrides in{Tn * 3 * C, hs, 3 * C}, scores{NH * Tn * Tn, Tn * Tn, Tn};
  head_gemm(false, true, B, NH, Tn, Tn, hs, scale, qkv, in, qkv + C, in, 0.0f, att, scores);
  A* p = detail::attention_scratch<A>(B * NH * Tn * Tn);
  detail::causal_softmax(att, p, B * NH * Tn, Tn);
  head_gemm(false, false, B, NH, Tn, hs, Tn, 1.0f, static_cast<const A*>(p), scores, qkv + 2 * C,
            in, 0.0f, out, HeadStrides{Tn * C, hs, C});
}

template <class A, std::enable_if_t<kNarrow<A>, int> = 0>
void attention_backward(A* dqkv, float* datt, const A* dout, const A* qkv, const float* att,
                        int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const HeadStrides in{Tn * 3 * C, hs, 3 * C}, scores{NH * Tn * Tn, Tn * Tn, Tn};
  const HeadStrides grad{Tn * C, hs, C};
  const int64_t rows = B * NH * Tn;
  A* p = detail::attention_scratch<A>(rows * Tn);
  parallel_for("attention_round", rows, [=](const int64_t r) {
    narrow_n(p + r * Tn, att + r * Tn, Tn);
  });
  head_gemm(false, true, B, NH, Tn, Tn, hs, 1.0f, dout, grad, qkv + 2 * C, in, 0.0f, datt,
            scores);  // dA = dO V^T
  head_gemm(true, false, B, NH, Tn, hs, Tn, 1.0f, static_cast<const A*>(p), scores, dout, grad,
            0.0f, dqkv + 2 * C, in);  // dV = A^T dO
  // Softmax backward: dS = A * (dA - rowsum(A * dA)) times the score
  // scale, zero above the diagonal, rounded to A for the two products.
  parallel_for("attention_softmax_backward", rows, [=](const int64_t r) {
    const int64_t t = r % Tn;
    const float* ar = att + r * Tn;
    float* dr = datt + r * Tn;
    float dot = 0;
    for (int64_t j = 0; j <= t; ++j) dot += ar[j] * dr[j];
    for (int64_t j = 0; j <= t; ++j) dr[j] = scale * ar[j] * (dr[j] - dot);
    for (int64_t j = t + 1; j < Tn; ++j) dr[j] = 0.0f;
    narrow_n(p + r * Tn, dr, Tn);
  });
  head_gemm(false, false, B, NH, Tn, hs, Tn, 1.0f, static_cast<const A*>(p), scores, qkv + C, in,
            0.0f, dqkv, in);  // dQ = dS K
  head_gemm(true, false, B, NH, Tn, hs, Tn, 1.0f, static_cast<const A*>(p), scores, qkv, in, 0.0f,
            dqkv + C, in);  // dK = dS^T Q
}

template <class T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C,
                       int64_t NH) {
  const int64_t hs = C / NH;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  serial_for("attention_forward", B * NH, [=](const int64_t bh) {
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
  serial_for("attention_backward", B * NH, [=](const int64_t bh) {
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
