// The Mixture-of-Experts router's arithmetic, written once for both back
// ends (host/moe_router.hpp, which defines what it computes, and
// cuda/moe_router.cu call it per token and per sequence), and what they
// take and report.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>

#include "common/context_chunks.hpp"

#if defined(__CUDACC__)
#define MPIFORMER_ROUTER_FN __host__ __device__ __forceinline__
#else
#define MPIFORMER_ROUTER_FN inline
#endif

namespace mpiformer {

struct RouterShape {
  int64_t tokens = 0;    // N rows
  int64_t seq_len = 0;   // rows per sequence held here (N a multiple of it)
  int64_t experts = 0;   // E
  int64_t top_k = 0;     // k <= E
  int64_t capacity = 0;  // per expert per sequence; 0: no limit
  // Context parallelism: each sequence's seq_len x context positions are
  // split over `context` ranks; this one holds its two chunks
  // (context_chunks(context_rank, context, order)) chunk-major,
  // [2, S, seq_len / 2], as the data feeder lays them out. Capacity and
  // the aux loss are the whole sequence's (host/moe_router.hpp).
  int64_t context = 1, context_rank = 0;
  ContextChunks order = ContextChunks::kHeadTail;
};

// Under context parallelism the router's exchange over the context
// group, in the back end's memory (device pointers on a GPU, ordered on
// its stream by the group's communicator): `gather`, every rank's n values
// into all [context, n] in rank order; `sum`, n values summed over the
// group in place.
struct RouterExchange {
  std::function<void(const double* mine, double* all, int64_t n)> gather;
  std::function<void(double* data, int64_t n)> sum;
};

// T: the whole sequence's length.
MPIFORMER_ROUTER_FN int64_t router_length(const RouterShape& r) { return r.seq_len * r.context; }
MPIFORMER_ROUTER_FN int64_t router_sequences(const RouterShape& r) { return r.tokens / r.seq_len; }

// The row of sequence s's i-th position held here (i < seq_len), and the
// sequence of a row: sequence by sequence, or chunk-major under context
// parallelism.
MPIFORMER_ROUTER_FN int64_t router_row(const RouterShape& r, int64_t s, int64_t i) {
  if (r.context == 1) return s * r.seq_len + i;
  const int64_t n = r.seq_len / 2;
  return ((i / n) * router_sequences(r) + s) * n + i % n;
}
MPIFORMER_ROUTER_FN int64_t router_sequence_of(const RouterShape& r, int64_t row) {
  if (r.context == 1) return row / r.seq_len;
  return (row / (r.seq_len / 2)) % router_sequences(r);
}

// What a call adds to `totals` (kRouterTotals doubles, +=), summed over
// its sequences: the aux loss's sum_s aux(s), the z loss's sum_n z(n), the
// assignments dropped over capacity.
enum RouterTotal : int { kAuxSum, kZSum, kDropped, kRouterTotals };

// Token n: its softmax p [E] and log-sum-exp from its logits l [E]; its k
// experts x [k] (each pass the largest logit not yet taken; strictly
// larger wins, so of equals the lower index comes first) and their gates
// g [k], renormalised over the k.
template <class T>
MPIFORMER_ROUTER_FN void router_token(const T* l, T* p, T& lse, int32_t* x, T* g, int64_t E,
                                      int64_t K) {
#if !defined(__CUDA_ARCH__)
  using std::exp;  // on the device, CUDA's own overloads
  using std::log;
#endif
  T m = l[0];
  for (int64_t e = 1; e < E; ++e) m = l[e] > m ? l[e] : m;
  T sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (p[e] = exp(l[e] - m));
  for (int64_t e = 0; e < E; ++e) p[e] /= sum;
  lse = m + log(sum);
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
  for (int64_t j = 0; j < K; ++j) g[j] = p[x[j]] / picked;
}

// The i-th assignment of sequence s in capacity order (every token's first
// choice by position, then every second choice, ...): its index into
// expert and dest.
MPIFORMER_ROUTER_FN int64_t router_assignment(const RouterShape& r, int64_t s, int64_t i) {
  return router_row(r, s, i % r.seq_len) * r.top_k + i / r.seq_len;
}

// An assignment's dest from its place in its expert's queue: -1 past
// capacity.
MPIFORMER_ROUTER_FN int32_t router_dest(const RouterShape& r, int64_t place) {
  return r.capacity > 0 && place >= r.capacity ? -1 : static_cast<int32_t>(place);
}

// Assignments an expert drops of `count` it was given in one sequence.
MPIFORMER_ROUTER_FN int64_t router_drops(const RouterShape& r, int64_t count) {
  return r.capacity > 0 && count > r.capacity ? count - r.capacity : 0;
}

// Expert e's part of aux(s) / E: the share of the sequence's assignments
// it was given, times its mean probability (prob_sum: over the sequence's
// tokens; count and prob_sum the whole sequence's).
template <class T>
MPIFORMER_ROUTER_FN T router_aux_term(const RouterShape& r, int64_t count, T prob_sum) {
  const int64_t L = router_length(r);
  return static_cast<T>(count) / static_cast<T>(L * r.top_k) * (prob_sum / static_cast<T>(L));
}

// Sequence s: its assignments taken in capacity order, each given its place
// in its expert's queue (dest, -1 past capacity), the counts c [E] before
// dropping; the drops counted; returns aux(s). (The GPU takes the places
// by a scan per expert, from the same pieces.)
template <class T>
MPIFORMER_ROUTER_FN T router_sequence(const RouterShape& r, int64_t s, const T* probs,
                                      const int32_t* expert, int32_t* dest, int32_t* c,
                                      int64_t& dropped) {
  const int64_t L = r.seq_len, E = r.experts, K = r.top_k;
  for (int64_t e = 0; e < E; ++e) c[e] = 0;
  for (int64_t i = 0; i < L * K; ++i) {
    const int64_t a = router_assignment(r, s, i);
    const int32_t e = expert[a];
    dest[a] = router_dest(r, c[e]);
    ++c[e];
  }
  dropped = 0;
  T total = 0;
  for (int64_t e = 0; e < E; ++e) {
    T sum = 0;
    for (int64_t t = 0; t < L; ++t) sum += probs[router_row(r, s, t) * E + e];
    total += router_aux_term(r, c[e], sum);
    dropped += router_drops(r, c[e]);
  }
  return static_cast<T>(E) * total;
}

// Under context parallelism, each rank counts its assignments per
// (sequence s, choice j, chunk q of its two, expert e): cell
// ((s k + j) 2 + q) E + e of router_context_cells(r).
MPIFORMER_ROUTER_FN int64_t router_context_cells(const RouterShape& r) {
  return router_sequences(r) * r.top_k * 2 * r.experts;
}
MPIFORMER_ROUTER_FN int64_t router_context_cell(const RouterShape& r, int64_t s, int64_t j, int64_t q,
                                                int64_t e) {
  return ((s * r.top_k + j) * 2 + q) * r.experts + e;
}

// Sequence s, expert e under context parallelism, from every rank's
// counts `all` [context, router_context_cells(r)]: where each of this
// rank's (choice, chunk) cells of e starts in e's capacity order (every
// first choice by position, then every second choice...: by choice, then
// by chunk of the whole sequence, then by position), into `next`; returns
// the whole sequence's count of e (before dropping).
MPIFORMER_ROUTER_FN int64_t router_context_places(const RouterShape& r, int64_t s, int64_t e,
                                                  const double* all, double* next) {
  const int64_t cells = router_context_cells(r), P = r.context;
  double before = 0;
  for (int64_t j = 0; j < r.top_k; ++j)
    for (int64_t g = 0; g < 2 * P; ++g) {
      const ContextChunkOwner o = context_chunk_owner(g, P, r.order);
      if (o.rank == r.context_rank) next[router_context_cell(r, s, j, o.which, e)] = before;
      before += all[o.rank * cells + router_context_cell(r, s, j, o.which, e)];
    }
  return static_cast<int64_t>(before);
}

// Scratch a call of either back end's router_forward needs, in 8-byte
// words: three per (sequence, expert) (the rows' starts; on the GPU also
// each expert's drops and aux term per sequence); under context
// parallelism also the rows each expert keeps here and the probabilities'
// sums per (sequence, expert), and this rank's and every rank's assignment
// counts per (sequence, choice, chunk, expert).
MPIFORMER_ROUTER_FN int64_t router_scratch_words(const RouterShape& r) {
  const int64_t SE = router_sequences(r) * r.experts;
  if (r.context == 1) return 3 * SE;
  return 5 * SE + (r.context + 1) * router_context_cells(r);
}

// The dispatched rows: start [S E], where expert e's kept places of
// sequence s begin (after the experts before e, then e's places of the
// sequences before s), and kept [E]. The places e keeps of s: `taken`
// [S E] where given (context parallelism: this rank's share), else its
// count chose [S E] up to the capacity.
MPIFORMER_ROUTER_FN void router_rows(const RouterShape& r, const int32_t* chose,
                                     const int64_t* taken, int64_t* start, int64_t* kept) {
  const int64_t E = r.experts, S = router_sequences(r);
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t first = row;
    for (int64_t s = 0; s < S; ++s) {
      start[s * E + e] = row;
      const int64_t c = chose[s * E + e];
      row += taken != nullptr ? taken[s * E + e] : r.capacity > 0 && c > r.capacity ? r.capacity : c;
    }
    kept[e] = row - first;
  }
}

// Token n's logits' gradient dl [E] (=): the aux loss's E f_e / T on every
// expert's probability, the gates' renormalisation on the chosen, through
// the softmax; the z loss's 2 lse p_e added.
template <class T>
MPIFORMER_ROUTER_FN void router_token_backward(const RouterShape& r, T* dl, const T* dgate,
                                               const T* p, T lse, const int32_t* x, const T* gate,
                                               const int32_t* c, T aux_scale, T z_scale) {
  const int64_t E = r.experts, K = r.top_k, L = router_length(r);
  const T f = aux_scale * static_cast<T>(E) / static_cast<T>(L * K * L);
  for (int64_t e = 0; e < E; ++e) dl[e] = f * static_cast<T>(c[e]);
  T picked = 0, dot = 0;
  for (int64_t j = 0; j < K; ++j) {
    picked += p[x[j]];
    dot += dgate[j] * gate[j];
  }
  for (int64_t j = 0; j < K; ++j) dl[x[j]] += (dgate[j] - dot) / picked;
  T inner = 0;
  for (int64_t e = 0; e < E; ++e) inner += p[e] * dl[e];
  for (int64_t e = 0; e < E; ++e) dl[e] = p[e] * (dl[e] - inner) + z_scale * 2 * lse * p[e];
}

}  // namespace mpiformer
