// Causal multi-head self-attention from a fused qkv projection.
// Layout: qkv [B,T,3C] (q, then k, then v; head h uses channels h*hs.. of each),
// out [B,T,C] (heads side by side), att [B,NH,T,T] softmax probabilities
// (saved for backward; entries above the diagonal are zero).
// The products run as per-(batch, head) GEMMs with strided leading dimensions,
// so no transposed copies of q, k or v are made. The full T x T score matrix is
// computed and masked: twice the causal FLOPs, but in BLAS rather than loops.
#pragma once
#include <cmath>
#include <cstdint>

#include "gemm.hpp"
#include "fast_math.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

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
