// The router of a Mixture-of-Experts layer (issue 30): softmax over E
// experts, the top k of each token (ties to the lower expert index), their
// probabilities renormalised over the k as the gate weights, a capacity per
// expert per sequence, and the load-balancing (Switch / GShard, top-k as
// Megatron counts it) and z losses with their gradients.
//
// Rows are tokens, sequence by sequence: row n is position n % T of
// sequence n / T (under context parallelism, a rank's two chunks of each
// sequence, chunk-major: common/moe_routing.hpp's router_row).
// Everything that decides a token's fate is per whole sequence, so a
// token is routed, kept or dropped the same in every layout (micro
// batches and data ranks hold whole sequences; context ranks exchange
// their counts, router_capacity_context).
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
#include <stdexcept>

#include "common/moe_routing.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

// Host memory a call needs (the rows' starts, each sequence's aux loss and
// drops: within router_scratch_words), so a caller sizes it once.
inline size_t router_scratch_bytes(const RouterShape& r) {
  return static_cast<size_t>(router_scratch_words(r)) * sizeof(int64_t);
}

// Under context parallelism (r.context > 1): capacity and the aux loss
// over whole sequences of which this rank holds two chunks. Each rank
// counts its assignments per (sequence, choice, chunk, expert); with
// every rank's counts (one gather) it knows how many of an expert's
// assignments come before each of its own in the whole sequence's
// capacity order (every first choice by position, then every second
// choice...: by choice, then by chunk, then by position), so it keeps
// and drops exactly what one rank holding the sequence would. Its chunks
// are in ascending order here, so the places it keeps of an expert are a
// prefix of its own and number its dispatched rows. chose [S E]: the
// whole sequence's counts (backward's f); taken [S E]: the rows kept
// here; aux [S], dropped [S] as router_sequence's (drops: this rank's).
template <class T>
void router_capacity_context(const RouterShape& r, const T* probs, const int32_t* expert,
                             int32_t* dest, int32_t* chose, int64_t* taken, double* aux,
                             int64_t* dropped, double* work, const RouterExchange& x) {
  const int64_t S = router_sequences(r), E = r.experts, K = r.top_k, L = r.seq_len, n = L / 2,
                P = r.context, cells = router_context_cells(r);
  double* next = work;              // [S K 2 E]: this rank's counts, then its next places
  double* all = next + cells;       // [P S K 2 E]: every rank's counts
  double* prob_sum = all + P * cells;  // [S E]
  parallel_for("router_context_counts", S, [=](const int64_t s) {
    for (int64_t j = 0; j < K; ++j)
      for (int64_t q = 0; q < 2; ++q) {
        for (int64_t e = 0; e < E; ++e) next[router_context_cell(r, s, j, q, e)] = 0;
        for (int64_t t = 0; t < n; ++t)
          next[router_context_cell(r, s, j, q, expert[router_row(r, s, q * n + t) * K + j])] += 1;
      }
    for (int64_t e = 0; e < E; ++e) {
      T sum = 0;
      for (int64_t i = 0; i < L; ++i) sum += probs[router_row(r, s, i) * E + e];
      prob_sum[s * E + e] = static_cast<double>(sum);
    }
  });
  x.gather(next, all, cells);
  x.sum(prob_sum, S * E);
  parallel_for("router_context_capacity", S, [=](const int64_t s) {
    for (int64_t e = 0; e < E; ++e) {
      chose[s * E + e] = static_cast<int32_t>(router_context_places(r, s, e, all, next));
      taken[s * E + e] = 0;
    }
    dropped[s] = 0;
    for (int64_t j = 0; j < K; ++j)
      for (int64_t q = 0; q < 2; ++q)
        for (int64_t t = 0; t < n; ++t) {
          const int64_t a = router_row(r, s, q * n + t) * K + j;
          const int32_t e = expert[a];
          double& place = next[router_context_cell(r, s, j, q, e)];
          if (router_dest(r, static_cast<int64_t>(place)) < 0) {
            dest[a] = -1;
            ++dropped[s];
          } else {
            dest[a] = static_cast<int32_t>(taken[s * E + e]++);
          }
          place += 1;
        }
    T total = 0;
    for (int64_t e = 0; e < E; ++e)
      total += router_aux_term(r, chose[s * E + e], static_cast<T>(prob_sum[s * E + e]));
    aux[s] = static_cast<double>(static_cast<T>(E) * total);
  });
}

// probs [N, E]: the softmax (kept for backward); lse [N]; expert, gate and
// dest [N k]; chose [S E]: assignments per sequence and expert before
// dropping (backward's f); kept [E]: rows per expert in the dispatched
// buffer; scratch: router_scratch_bytes(r); exchange: the context group's
// where r.context > 1 (each sequence's aux loss is then added to totals
// by context rank 0 alone: the group sums them as one sequence's).
template <class T>
void router_forward(const RouterShape& r, const T* logits, T* probs, T* lse, int32_t* expert,
                    T* gate, int32_t* dest, int32_t* chose, int64_t* kept, double* totals,
                    void* scratch, const RouterExchange* exchange = nullptr) {
  const int64_t N = r.tokens, E = r.experts, K = r.top_k, S = router_sequences(r);
  parallel_for("router_softmax_topk", N, [=](const int64_t n) {
    router_token(logits + n * E, probs + n * E, lse[n], expert + n * K, gate + n * K, E, K);
  });
  // Capacity, sequence by sequence (each independent): places in the
  // experts' queues, then the sequence's aux loss (in double: the scratch
  // is 8-byte words).
  int64_t* start = static_cast<int64_t*>(scratch);
  int64_t* dropped = start + S * E;
  double* aux = reinterpret_cast<double*>(dropped + S);
  int64_t* taken = nullptr;
  if (r.context > 1) {
    if (exchange == nullptr) throw std::logic_error("router_forward: context parallel without an exchange");
    taken = start + 3 * S * E;
    router_capacity_context(r, probs, expert, dest, chose, taken, aux, dropped,
                            reinterpret_cast<double*>(taken + S * E), *exchange);
  } else {
    parallel_for("router_capacity", S, [=](const int64_t s) {
      aux[s] = static_cast<double>(router_sequence(r, s, probs, expert, dest, chose + s * E, dropped[s]));
    });
  }
  router_rows(r, chose, taken, start, kept);
  parallel_for("router_dest", N, [=](const int64_t n) {
    const int64_t s = router_sequence_of(r, n);
    for (int64_t j = 0; j < K; ++j) {
      int32_t& d = dest[n * K + j];
      if (d >= 0) d = static_cast<int32_t>(start[s * E + expert[n * K + j]] + d);
    }
  });
  for (int64_t s = 0; s < S; ++s) {
    if (r.context_rank == 0) totals[kAuxSum] += aux[s];
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
  const int64_t E = r.experts, K = r.top_k;
  parallel_for("router_backward", r.tokens, [=](const int64_t n) {
    router_token_backward(r, dlogits + n * E, dgate + n * K, probs + n * E, lse[n], expert + n * K,
                          gate + n * K, chose + router_sequence_of(r, n) * E, aux_scale, z_scale);
  });
}

}  // namespace mpiformer::host
