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

#include "common/moe_routing.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

// Host memory a call needs (the rows' starts, each sequence's aux loss and
// drops: within router_scratch_words), so a caller sizes it once.
inline size_t router_scratch_bytes(const RouterShape& r) {
  return static_cast<size_t>(router_scratch_words(r)) * sizeof(int64_t);
}

// probs [N, E]: the softmax (kept for backward); lse [N]; expert, gate and
// dest [N k]; chose [S E]: assignments per sequence and expert before
// dropping (backward's f); kept [E]: rows per expert in the dispatched
// buffer; scratch: router_scratch_bytes(r).
template <class T>
void router_forward(const RouterShape& r, const T* logits, T* probs, T* lse, int32_t* expert,
                    T* gate, int32_t* dest, int32_t* chose, int64_t* kept, double* totals,
                    void* scratch) {
  const int64_t N = r.tokens, E = r.experts, K = r.top_k, S = N / r.seq_len, L = r.seq_len;
  parallel_for("router_softmax_topk", N, [=](const int64_t n) {
    router_token(logits + n * E, probs + n * E, lse[n], expert + n * K, gate + n * K, E, K);
  });
  // Capacity, sequence by sequence (each independent): places in the
  // experts' queues, then the sequence's aux loss (in double: the scratch
  // is 8-byte words).
  int64_t* start = static_cast<int64_t*>(scratch);
  int64_t* dropped = start + S * E;
  double* aux = reinterpret_cast<double*>(dropped + S);
  parallel_for("router_capacity", S, [=](const int64_t s) {
    aux[s] = static_cast<double>(router_sequence(r, s, probs, expert, dest, chose + s * E, dropped[s]));
  });
  router_rows(r, chose, start, kept);
  parallel_for("router_dest", N, [=](const int64_t n) {
    const int64_t s = n / L;
    for (int64_t j = 0; j < K; ++j) {
      int32_t& d = dest[n * K + j];
      if (d >= 0) d = static_cast<int32_t>(start[s * E + expert[n * K + j]] + d);
    }
  });
  for (int64_t s = 0; s < S; ++s) {
    totals[kAuxSum] += aux[s];
    totals[kDropped] += static_cast<double>(dropped[s]);
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
  const int64_t E = r.experts, K = r.top_k, L = r.seq_len;
  parallel_for("router_backward", r.tokens, [=](const int64_t n) {
    router_token_backward(r, dlogits + n * E, dgate + n * K, probs + n * E, lse[n], expert + n * K,
                          gate + n * K, chose + (n / L) * E, aux_scale, z_scale);
  });
}

}  // namespace mpiformer::host
