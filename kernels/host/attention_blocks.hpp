// Causal attention one (query block, key/value block) pair at a time, with
// the softmax carried across key/value blocks in running accumulators
// (the "online softmax" of blockwise and ring attention): the arithmetic a
// context-parallel rank does as key/value blocks pass it around a ring
// (issue 49), written once for any order of the blocks.
//
// One head's rows, row-major with leading dimensions: q [nq, hs] at global
// positions q0.., k and v [nk, hs] at global positions k0... A key attends
// where its position is at most the query's. Per query row the forward
// keeps m (the running maximum score), l (the sum of exp(score - m)) and o
// (the unnormalised output, sum of exp(score - m) v): a block raises m
// where it holds a larger score and rescales what came before. After every
// block, finish() divides o by l and leaves lse = m + log l, what backward
// needs. Backward takes each pair again with the output's gradient dout,
// lse and delta = rowsum(dout * out): P = exp(S - lse), dV += P^T dout,
// dS = P * (dout V^T - delta), dQ += scale dS K, dK += scale dS^T Q; the
// dK and dV partial sums are what a ring passes back to the block's owner.
// A pair whose keys all follow its queries is skipped without work.
// Compute type T (float, or double for checks): the products through the
// BLAS, the softmax row by row.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attention.hpp"
#include "common/attention_shape.hpp"
#include "common/attention_storage.hpp"
#include "common/context_chunks.hpp"
#include "fast_math.hpp"
#include "gemm.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

// Which key positions of a block a query at position `pos` sees: the first
// `count` keys (all, some, or none).
inline int64_t visible_keys(int64_t pos, int64_t k0, int64_t nk) {
  return std::clamp<int64_t>(pos - k0 + 1, 0, nk);
}
// Whether any query of [q0, q0 + nq) sees any key of [k0, k0 + nk).
inline bool block_visible(int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  return nq > 0 && nk > 0 && k0 <= q0 + nq - 1;
}

// Under a document mask a query sees the keys of its own document only,
// from the document's first position `start` up to its own: within a
// block the keys [lo, hi) (documents are contiguous), empty where hi <=
// lo. `starts` (per query row, nullptr: one document) gives each row's.
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange visible_range(const int64_t* starts, int64_t i, int64_t pos, int64_t k0, int64_t nk) {
  const int64_t hi = visible_keys(pos, k0, nk);
  const int64_t lo = starts == nullptr ? 0 : std::clamp<int64_t>(starts[i] - k0, 0, nk);
  return {lo, std::max(lo, hi)};
}
// Whether any of the block's queries sees any of its keys: a block of
// another document, or above the diagonal, is skipped without work.
inline bool block_visible(const int64_t* starts, int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  if (!block_visible(q0, nq, k0, nk)) return false;
  if (starts == nullptr) return true;
  for (int64_t i = 0; i < nq; ++i) {
    const KeyRange r = visible_range(starts, i, q0 + i, k0, nk);
    if (r.hi > r.lo) return true;
  }
  return false;
}

// The accumulators of nq rows before the first block: m = -inf, l = 0, o = 0.
template <class T>
void block_attention_start(T* m, T* l, T* o, int64_t ldo, int64_t nq, int64_t hs) {
  for (int64_t i = 0; i < nq; ++i) {
    m[i] = -std::numeric_limits<T>::infinity();
    l[i] = T(0);
    std::fill(o + i * ldo, o + i * ldo + hs, T(0));
  }
}

// One pair into the accumulators. `scores`: scratch of nq * nk. `starts`:
// the rows' documents (visible_range; nullptr: one document).
template <class T>
void block_attention_forward(const T* q, int64_t ldq, int64_t q0, int64_t nq, const T* k,
                             const T* v, int64_t ldkv, int64_t k0, int64_t nk, int64_t hs, T* m,
                             T* l, T* o, int64_t ldo, T* scores, const int64_t* starts = nullptr) {
  if (!block_visible(starts, q0, nq, k0, nk)) return;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  gemm(false, true, nq, nk, hs, scale, q, ldq, k, ldkv, T(0), scores, nk);  // S = scale Q K^T
  for (int64_t i = 0; i < nq; ++i) {
    T* s = scores + i * nk;
    const KeyRange seen = visible_range(starts, i, q0 + i, k0, nk);
    if (seen.hi == seen.lo) {
      std::fill(s, s + nk, T(0));
      continue;
    }
    const T peak = std::max(m[i], *std::max_element(s + seen.lo, s + seen.hi));
    // What came before, in units of the new maximum (exp(-inf) = 0 the
    // first time).
    const T keep = m[i] == -std::numeric_limits<T>::infinity() ? T(0) : exp_fast(m[i] - peak);
    T sum = T(0);
    for (int64_t j = seen.lo; j < seen.hi; ++j) {
      s[j] = exp_fast(s[j] - peak);
      sum += s[j];
    }
    std::fill(s, s + seen.lo, T(0));
    std::fill(s + seen.hi, s + nk, T(0));
    l[i] = l[i] * keep + sum;
    m[i] = peak;
    T* oi = o + i * ldo;
    for (int64_t c = 0; c < hs; ++c) oi[c] *= keep;
  }
  gemm(false, false, nq, hs, nk, T(1), scores, nk, v, ldkv, T(1), o, ldo);  // O += P V
}

// After the last pair: out = o / l in place, lse = m + log l.
template <class T>
void block_attention_finish(T* o, int64_t ldo, const T* m, const T* l, int64_t nq, int64_t hs,
                            T* lse) {
  for (int64_t i = 0; i < nq; ++i) {
    const T inv = T(1) / l[i];
    for (int64_t c = 0; c < hs; ++c) o[i * ldo + c] *= inv;
    lse[i] = m[i] + std::log(l[i]);
  }
}

// delta[i] = dout_i . out_i, once per query row before backward's pairs.
template <class T>
void block_attention_delta(const T* dout, int64_t lddo, const T* out, int64_t ldo, int64_t nq,
                           int64_t hs, T* delta) {
  for (int64_t i = 0; i < nq; ++i) delta[i] = dot_of(dout + i * lddo, out + i * ldo, hs);
}

// One pair's gradients, added into dq [nq, hs] and dk, dv [nk, hs].
// `scores`, `dscores`: scratch of nq * nk each.
template <class T>
void block_attention_backward(const T* q, int64_t ldq, int64_t q0, int64_t nq, const T* k,
                              const T* v, int64_t ldkv, int64_t k0, int64_t nk, int64_t hs,
                              const T* dout, int64_t lddo, const T* lse, const T* delta, T* dq,
                              int64_t lddq, T* dk, T* dv, int64_t lddkv, T* scores, T* dscores,
                              const int64_t* starts = nullptr) {
  if (!block_visible(starts, q0, nq, k0, nk)) return;
  const T scale = T(1) / std::sqrt(static_cast<T>(hs));
  gemm(false, true, nq, nk, hs, scale, q, ldq, k, ldkv, T(0), scores, nk);      // S
  gemm(false, true, nq, nk, hs, T(1), dout, lddo, v, ldkv, T(0), dscores, nk);  // dP = dO V^T
  for (int64_t i = 0; i < nq; ++i) {
    T* p = scores + i * nk;
    T* ds = dscores + i * nk;
    const KeyRange seen = visible_range(starts, i, q0 + i, k0, nk);
    for (int64_t j = seen.lo; j < seen.hi; ++j) {
      p[j] = exp_fast(p[j] - lse[i]);
      ds[j] = scale * p[j] * (ds[j] - delta[i]);
    }
    std::fill(p, p + seen.lo, T(0));
    std::fill(ds, ds + seen.lo, T(0));
    std::fill(p + seen.hi, p + nk, T(0));
    std::fill(ds + seen.hi, ds + nk, T(0));
  }
  gemm(true, false, nk, hs, nq, T(1), scores, nk, dout, lddo, T(1), dv, lddkv);  // dV += P^T dO
  gemm(false, false, nq, hs, nk, T(1), dscores, nk, k, ldkv, T(1), dq, lddq);    // dQ += dS K
  gemm(true, false, nk, hs, nq, T(1), dscores, nk, q, ldq, T(1), dk, lddkv);     // dK += dS^T Q
}

// Every head of a micro-batch at once, in the model's layouts (GQA as in
// host/attention.hpp: query head h reads kv head h / (NH / NKV)):
//   q rows of qkv [B, nq, C + 2K] (the query block's own fused rows, q part),
//   a key/value block kv [B, nk, 2K] (each row's keys then values: what a
//     ring passes from rank to rank),
//   accumulators m, l [B, NH, nq] and o [B, nq, C] (heads side by side, as
//     attention's output), dkv [B, nk, 2K] (the block's partial gradients,
//     passed back to its owner), dqkv [B, nq, C + 2K] (q part),
//   starts [B, nq] under a document mask: each query's document's first
//     position (visible_range; nullptr: one document per sequence).
// A (batch, kv head) pair per task: its query heads add into the same dk
// and dv one after another, so no two tasks write the same element and
// the sums' order does not depend on the threads.
using AttentionShape = mpiformer::AttentionShape;  // common/attention_shape.hpp

template <class T>
void ring_attention_start(const AttentionShape& a, int64_t nq, T* m, T* l, T* o) {
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.NH; ++h)
      block_attention_start(m + (b * a.NH + h) * nq, l + (b * a.NH + h) * nq, o + b * nq * a.C + h * a.hs(),
                            a.C, nq, a.hs());
}

namespace detail {
// Tile [i, i + rows) of nq query rows at q0 against nk keys at k0: the
// keys it can see under the causal mask (0: none).
inline int64_t tile_keys(int64_t q0, int64_t i, int64_t rows, int64_t k0, int64_t nk) {
  return std::clamp<int64_t>(q0 + i + rows - k0, 0, nk);
}
}  // namespace detail

// `scratch`: ring_scratch_elements(B, NKV, nq, nk, tile) (query tiles:
// common/attention_storage.hpp). Under the causal mask a tile reads only
// the keys up to its last query.
template <class T>
void ring_attention_forward(const AttentionShape& a, const T* qkv, int64_t q0, int64_t nq, const T* kv,
                            int64_t k0, int64_t nk, T* m, T* l, T* o, T* scratch,
                            const int64_t* starts = nullptr, int64_t tile = kRingQueryTile) {
  if (!block_visible(q0, nq, k0, nk)) return;
  const int64_t hs = a.hs(), K = a.K(), g = a.group(), ld = a.C + 2 * K, tq = std::min(tile, nq);
  task_for(a.B * a.NKV, gemm_serial_in_parallel_region<T>(), [&](const int64_t task) {
    const int64_t b = task / a.NKV, kvh = task % a.NKV;
    T* scores = scratch + task * 2 * tq * nk;
    const T* k = kv + b * nk * 2 * K + kvh * hs;
    for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h) {
      const int64_t row = (b * a.NH + h) * nq;
      for (int64_t i = 0; i < nq; i += tq) {
        const int64_t rows = std::min(tq, nq - i), keys = detail::tile_keys(q0, i, rows, k0, nk);
        if (keys == 0) continue;
        block_attention_forward(qkv + (b * nq + i) * ld + h * hs, ld, q0 + i, rows, k, k + K, 2 * K, k0,
                                keys, hs, m + row + i, l + row + i, o + (b * nq + i) * a.C + h * hs, a.C,
                                scores, starts != nullptr ? starts + b * nq + i : nullptr);
      }
    }
  });
}

// After the last block: o becomes the output, lse [B, NH, nq].
template <class T>
void ring_attention_finish(const AttentionShape& a, int64_t nq, T* o, const T* m, const T* l, T* lse) {
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.NH; ++h) {
      const int64_t row = (b * a.NH + h) * nq;
      block_attention_finish(o + b * nq * a.C + h * a.hs(), a.C, m + row, l + row, nq, a.hs(), lse + row);
    }
}
// Before backward's blocks: delta [B, NH, nq] from the output and its
// gradient dout [B, nq, C].
template <class T>
void ring_attention_delta(const AttentionShape& a, int64_t nq, const T* out, const T* dout, T* delta) {
  for (int64_t b = 0; b < a.B; ++b)
    for (int64_t h = 0; h < a.NH; ++h)
      block_attention_delta(dout + b * nq * a.C + h * a.hs(), a.C, out + b * nq * a.C + h * a.hs(), a.C, nq,
                            a.hs(), delta + (b * a.NH + h) * nq);
}

// `scratch`: as forward's.
template <class T>
void ring_attention_backward(const AttentionShape& a, const T* qkv, int64_t q0, int64_t nq, const T* kv,
                             int64_t k0, int64_t nk, const T* dout, const T* lse, const T* delta, T* dqkv,
                             T* dkv, T* scratch, const int64_t* starts = nullptr,
                             int64_t tile = kRingQueryTile) {
  if (!block_visible(q0, nq, k0, nk)) return;
  const int64_t hs = a.hs(), K = a.K(), g = a.group(), ld = a.C + 2 * K, tq = std::min(tile, nq);
  task_for(a.B * a.NKV, gemm_serial_in_parallel_region<T>(), [&](const int64_t task) {
    const int64_t b = task / a.NKV, kvh = task % a.NKV;
    T* scores = scratch + task * 2 * tq * nk;
    const T* k = kv + b * nk * 2 * K + kvh * hs;
    T* dk = dkv + b * nk * 2 * K + kvh * hs;
    for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h) {
      const int64_t row = (b * a.NH + h) * nq;
      for (int64_t i = 0; i < nq; i += tq) {
        const int64_t rows = std::min(tq, nq - i), keys = detail::tile_keys(q0, i, rows, k0, nk);
        if (keys == 0) continue;
        block_attention_backward(qkv + (b * nq + i) * ld + h * hs, ld, q0 + i, rows, k, k + K, 2 * K, k0,
                                 keys, hs, dout + (b * nq + i) * a.C + h * hs, a.C, lse + row + i,
                                 delta + row + i, dqkv + (b * nq + i) * ld + h * hs, ld, dk, dk + K, 2 * K,
                                 scores, scores + rows * keys,
                                 starts != nullptr ? starts + b * nq + i : nullptr);
      }
    }
  });
}

}  // namespace mpiformer::host
