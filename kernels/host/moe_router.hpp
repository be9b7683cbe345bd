// The router of a Mixture-of-Experts layer (issue 30): softmax over E
// experts, the top k of each token (ties to the lower expert index), their
// probabilities renormalised over the k as the gate weights, a capacity per
// expert per sequence, and the load-balancing (Switch / GShard, top-k as
// Megatron counts it) and z losses with their gradients.
//
// Rows are tokens, sequence by sequence: row n is position n % T of
// sequence n / T. Everything that decides a token's fate is per sequence,
// so a token is routed, kept or dropped the same in every layout (micro
// batches and ranks hold whole sequences).
//
// Capacity: each expert takes at most `capacity` assignments of a sequence
// (0: no limit). They are taken GShard's way: every token's first choice
// in position order, then every second choice, and so on; an assignment
// past an expert's capacity is dropped (that part of the token's MLP
// output is zero; with all k dropped the token keeps its residual only).
//
// Dispatch: kept assignments are numbered expert by expert (all of expert
// 0's, then expert 1's), inside an expert sequence by sequence and in the
// order they were taken. `dest[n k + j]` is the row of the dispatched
// buffer that assignment j of token n goes to, -1 when dropped; expert e's
// rows are [offset_e, offset_e + kept_e) with offset_e the kept rows of
// the experts before it: each expert's tokens contiguous, as its GEMMs and
// an all-to-all over expert-parallel ranks need them.
//
// Losses, per sequence s of T tokens, with f_e(s) the fraction of its T k
// assignments (before dropping) that chose e and P_e(s) its tokens' mean
// probability of e:
//   aux(s) = E sum_e f_e(s) P_e(s)  (1 when the router is uniform),
//   z(n)   = logsumexp(logits_n)^2.
// The caller scales them (coefficient, mean over sequences or tokens);
// f_e is a count and carries no gradient, as in Switch.
//
// T is the arithmetic and storage type (the stage's Acc).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/moe_routing.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

// probs [N, E]: the softmax (kept for backward); lse [N]; expert, gate and
// dest [N k]; chose [S E]: assignments per sequence and expert before
// dropping (backward's f); kept [E]: rows per expert in the dispatched
// buffer.
template <class T>
void router_forward(const RouterShape& r, const T* logits, T* probs, T* lse, int32_t* expert,
                    T* gate, int32_t* dest, int32_t* chose, int64_t* kept, double* totals) {
  const int64_t N = r.tokens, E = r.experts, K = r.top_k, S = N / r.seq_len, L = r.seq_len;
  parallel_for("router_softmax_topk", N, [=](const int64_t n) {
    const T* l = logits + n * E;
    T* p = probs + n * E;
    T m = l[0];
    for (int64_t e = 1; e < E; ++e) m = l[e] > m ? l[e] : m;
    T sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - m));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    lse[n] = m + std::log(sum);
    // The k largest logits, each pass the largest not yet taken; strictly
    // larger wins, so of equals the lower index comes first.
    int32_t* x = expert + n * K;
    T picked = 0;
    for (int64_t j = 0; j < K; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || x[i] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = e;
      }
      x[j] = static_cast<int32_t>(best);
      picked += p[best];
    }
    for (int64_t j = 0; j < K; ++j) gate[n * K + j] = p[x[j]] / picked;
  });
  // Capacity, sequence by sequence (each independent): a place in its
  // expert's queue per assignment, -1 when dropped, then the sequence's
  // share of the aux loss.
  std::vector<T> aux(static_cast<size_t>(S));
  std::vector<int64_t> dropped(static_cast<size_t>(S));
  parallel_for("router_capacity", S, [=, &aux, &dropped](const int64_t s) {
    int32_t* c = chose + s * E;
    for (int64_t e = 0; e < E; ++e) c[e] = 0;
    for (int64_t j = 0; j < K; ++j) {
      for (int64_t t = 0; t < L; ++t) {
        const int64_t a = (s * L + t) * K + j;
        const int32_t e = expert[a];
        const bool full = r.capacity > 0 && c[e] >= r.capacity;
        dest[a] = full ? -1 : c[e];  // the place; made a row below
        ++c[e];
        dropped[static_cast<size_t>(s)] += full ? 1 : 0;
      }
    }
    T total = 0;
    for (int64_t e = 0; e < E; ++e) {
      T mean = 0;
      for (int64_t t = 0; t < L; ++t) mean += probs[(s * L + t) * E + e];
      total += static_cast<T>(c[e]) / static_cast<T>(L * K) * (mean / static_cast<T>(L));
    }
    aux[static_cast<size_t>(s)] = static_cast<T>(E) * total;
  });
  // Rows: expert e's kept places of sequence s start after the experts
  // before e (all sequences) and after e's kept places of sequences
  // before s.
  std::vector<int64_t> start(static_cast<size_t>(S * E));
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = row;
    for (int64_t s = 0; s < S; ++s) {
      start[static_cast<size_t>(s * E + e)] = row;
      const int64_t c = chose[s * E + e];
      row += r.capacity > 0 && c > r.capacity ? r.capacity : c;
    }
    kept[e] = row - first;
  }
  parallel_for("router_dest", N, [=, &start](const int64_t n) {
    const int64_t s = n / L;
    for (int64_t j = 0; j < K; ++j) {
      int32_t& d = dest[n * K + j];
      if (d >= 0) d = static_cast<int32_t>(start[static_cast<size_t>(s * E + expert[n * K + j])] + d);
    }
  });
  for (int64_t s = 0; s < S; ++s) {
    totals[kAuxSum] += static_cast<double>(aux[static_cast<size_t>(s)]);
    totals[kDropped] += static_cast<double>(dropped[static_cast<size_t>(s)]);
  }
  for (int64_t n = 0; n < N; ++n)
    totals[kZSum] += static_cast<double>(lse[n]) * static_cast<double>(lse[n]);
}

// dlogits [N, E] (=) from: dgate [N k], the loss's gradient with respect to
// each gate weight (zero for dropped assignments: the combine did not use
// them); aux_scale and z_scale, what multiplies sum_s aux(s) and sum_n z(n)
// in the loss.
template <class T>
void router_backward(const RouterShape& r, T* dlogits, const T* dgate, const T* probs,
                     const T* lse, const int32_t* expert, const T* gate, const int32_t* chose,
                     T aux_scale, T z_scale) {
  const int64_t N = r.tokens, E = r.experts, K = r.top_k, L = r.seq_len;
  parallel_for("router_backward", N, [=](const int64_t n) {
    const T* p = probs + n * E;
    const int32_t* x = expert + n * K;
    const int32_t* c = chose + (n / L) * E;
    T* dl = dlogits + n * E;
    // dL/dp: the aux loss's E f_e / T on every expert, the gates'
    // renormalisation (g_j = p_j / sum of the k) on the chosen ones.
    const T f = aux_scale * static_cast<T>(E) / static_cast<T>(L * K * L);
    for (int64_t e = 0; e < E; ++e) dl[e] = f * static_cast<T>(c[e]);
    T picked = 0, dot = 0;
    for (int64_t j = 0; j < K; ++j) {
      picked += p[x[j]];
      dot += dgate[n * K + j] * gate[n * K + j];
    }
    for (int64_t j = 0; j < K; ++j) dl[x[j]] += (dgate[n * K + j] - dot) / picked;
    // Through the softmax: dl_e = p_e (dp_e - sum_i p_i dp_i); the z
    // loss's 2 lse p_e adds to it directly.
    T inner = 0;
    for (int64_t e = 0; e < E; ++e) inner += p[e] * dl[e];
    for (int64_t e = 0; e < E; ++e) dl[e] = p[e] * (dl[e] - inner) + z_scale * 2 * lse[n] * p[e];
  });
}

}  // namespace mpiformer::host
