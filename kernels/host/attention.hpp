// Causal multi-head self-attention from a fused qkv projection, with
// grouped-query attention: NH query heads share NKV key/value heads (NKV
// divides NH; query head h reads kv head h / (NH / NKV); NKV = NH is
// multi-head attention, 1 multi-query).
// Layout: qkv [B,T,C+2K] (q [C = NH*hs], then k, then v [K = NKV*hs each];
// head h uses channels h*hs.. of its part), out [B,T,C] (heads side by
// side), att [B,NH,T,T] softmax probabilities in the compute type (saved
// for backward; entries above the diagonal are zero).
//
// The query heads of a group are taken one position at a time (g = NH /
// NKV calls of each product, each over the NKV kv heads with strided
// operands): with NKV = NH that is one call over every head, as before.
// Each product runs for every head at once (head_gemm: strided operands, no
// transposed copies of q, k or v), multiplying only the blocks of the T x T
// matrices on and below the diagonal; the softmax runs row by row in
// parallel between the products and writes the zeros above the diagonal.
//
// With 16-bit storage A the products take 16-bit operands and accumulate in
// float, as the GPU's tensor cores do: the scores and the softmax are float,
// the probabilities (and in backward the score gradients) are rounded to A
// for the products that read them. In float and double they are read as
// they are.
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

// What the products read of `rows` rows of T x T values: the values
// themselves, or (16-bit storage) their rounding to A in scratch, made by
// `fill(r, rounded_row)` as each row is finished.
template <class A, class S>
const A* operand_rows(S* values, int64_t rows, int64_t Tn) {
  if constexpr (kNarrow<A>) return attention_scratch<A>(rows * Tn);
  else return values;
}
}  // namespace detail

namespace detail {
// The strides of one position j of every query group: query head j + g*kv
// for kv = 0..NKV-1 (the products' "heads"), its scores and its output.
struct GroupStrides {
  int64_t g, hs, K;
  HeadStrides q, kv, scores, out;
  GroupStrides(int64_t Tn, int64_t C, int64_t NH, int64_t NKV)
      : g(NH / NKV), hs(C / NH), K(NKV * (C / NH)) {
    const int64_t ld = C + 2 * K;
    q = {Tn * ld, g * hs, ld};
    kv = {Tn * ld, hs, ld};
    scores = {NH * Tn * Tn, g * Tn * Tn, Tn};
    out = {Tn * C, g * hs, C};
  }
};
}  // namespace detail

// `positions` [B*T] (nullptr: none): each token's position in its
// document; row t then attends to keys t - positions[t] .. t only (the
// document's), its other probabilities zero, which backward then keeps
// zero (dS = P * (...)).
template <class A, class S = compute_t<A>>
void attention_forward(A* out, S* att, const A* qkv, int64_t B, int64_t Tn, int64_t C,
                       int64_t NH, int64_t NKV, const int32_t* positions = nullptr) {
  const detail::GroupStrides st(Tn, C, NH, NKV);
  const int64_t hs = st.hs, rows = B * NH * Tn;
  const S scale = S(1) / std::sqrt(static_cast<S>(hs));
  for (int64_t j = 0; j < st.g; ++j)
    head_gemm(Causal::kOutput, false, true, B, NKV, Tn, Tn, hs, scale, qkv + j * hs, st.q,
              qkv + C, st.kv, S(0), att + j * Tn * Tn, st.scores);
  const A* p = detail::operand_rows<A>(att, rows, Tn);
  A* rounded = const_cast<A*>(p);
  parallel_for("attention_softmax", rows, [=](const int64_t r) {
    const int64_t t = r % Tn, b = r / (NH * Tn);
    const int64_t lo = positions != nullptr ? t - positions[b * Tn + t] : 0;
    S* row = att + r * Tn;
    const S sum = exp_shift_sum(row + lo, t + 1 - lo, max_of(row + lo, t + 1 - lo));
    const S inv = S(1) / sum;
    for (int64_t j = 0; j < lo; ++j) row[j] = S(0);
    for (int64_t j = lo; j <= t; ++j) row[j] *= inv;
    for (int64_t j = t + 1; j < Tn; ++j) row[j] = S(0);
    if constexpr (kNarrow<A>) narrow_n(rounded + r * Tn, row, Tn);
  });
  for (int64_t j = 0; j < st.g; ++j)
    head_gemm(Causal::kLeft, false, false, B, NKV, Tn, hs, Tn, S(1), p + j * Tn * Tn, st.scores,
              qkv + C + st.K, st.kv, S(0), out + j * hs, st.out);
}

// One query against cached keys and values (incremental decoding): q [C]
// (NH heads) is row n-1's query; kv holds rows 0..n-1 of [n, 2K], each the
// row's keys then values (the kv heads only: K = NKV*hs, query head h
// reading kv head h / (NH / NKV)); out[C] receives the attention of row
// n-1 over rows 0..n-1. `scores` is scratch of n elements. The same
// arithmetic as a row of attention_forward.
template <class T>
void attention_forward_last(T* out, T* scores, const T* q_row, const T* kv, int64_t n, int64_t C,
                            int64_t NH, int64_t NKV) {
  const int64_t hs = C / NH, K = NKV * hs, g = NH / NKV;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  for (int64_t h = 0; h < NH; ++h) {
    const T* q = q_row + h * hs;
    const int64_t kvh = h / g;
    T mx = T(0);
    for (int64_t j = 0; j < n; ++j) {
      const T* k = kv + j * 2 * K + kvh * hs;
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
      const T* v = kv + j * 2 * K + K + kvh * hs;
      for (int64_t c = 0; c < hs; ++c) o[c] += p * v[c];
    }
  }
}

// dqkv is overwritten (=); datt is scratch of the size of att. A kv head's
// gradients sum its group's query heads', in order (beta = 1 after the
// first).
template <class A, class S = compute_t<A>>
void attention_backward(A* dqkv, S* datt, const A* dout, const A* qkv, const S* att, int64_t B,
                        int64_t Tn, int64_t C, int64_t NH, int64_t NKV) {
  const detail::GroupStrides st(Tn, C, NH, NKV);
  const int64_t hs = st.hs, rows = B * NH * Tn, K = st.K;
  const S scale = S(1) / std::sqrt(static_cast<S>(hs));
  // The probabilities as the forward's second product read them.
  const A* p = detail::operand_rows<A>(const_cast<S*>(att), rows, Tn);
  A* rounded = const_cast<A*>(p);
  if constexpr (kNarrow<A>)
    parallel_for("attention_round", rows,
                 [=](const int64_t r) { narrow_n(rounded + r * Tn, att + r * Tn, Tn); });
  for (int64_t j = 0; j < st.g; ++j) {
    head_gemm(Causal::kOutput, false, true, B, NKV, Tn, Tn, hs, S(1), dout + j * hs, st.out,
              qkv + C + K, st.kv, S(0), datt + j * Tn * Tn, st.scores);  // dA = dO V^T
    head_gemm(Causal::kLeft, true, false, B, NKV, Tn, hs, Tn, S(1), p + j * Tn * Tn, st.scores,
              dout + j * hs, st.out, S(j == 0 ? 0 : 1), dqkv + C + K, st.kv);  // dV = A^T dO
  }
  // Softmax backward in place: dS = A * (dA - rowsum(A * dA)), times the
  // score scale; zero above the diagonal so the products below stay causal.
  const A* ds = detail::operand_rows<A>(datt, rows, Tn);
  A* ds_rounded = const_cast<A*>(ds);
  parallel_for("attention_softmax_backward", rows, [=](const int64_t r) {
    const int64_t t = r % Tn;
    const S* ar = att + r * Tn;
    S* dr = datt + r * Tn;
    const S dot = dot_of(ar, dr, t + 1);
    for (int64_t j = 0; j <= t; ++j) dr[j] = scale * ar[j] * (dr[j] - dot);
    for (int64_t j = t + 1; j < Tn; ++j) dr[j] = S(0);
    if constexpr (kNarrow<A>) narrow_n(ds_rounded + r * Tn, dr, Tn);
  });
  for (int64_t j = 0; j < st.g; ++j) {
    head_gemm(Causal::kLeft, false, false, B, NKV, Tn, hs, Tn, S(1), ds + j * Tn * Tn, st.scores,
              qkv + C, st.kv, S(0), dqkv + j * hs, st.q);  // dQ = dS K
    head_gemm(Causal::kLeft, true, false, B, NKV, Tn, hs, Tn, S(1), ds + j * Tn * Tn, st.scores,
              qkv + j * hs, st.q, S(j == 0 ? 0 : 1), dqkv + C, st.kv);  // dK = dS^T Q
  }
}

}  // namespace mpiformer::host
