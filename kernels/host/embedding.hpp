// Token + position embedding. out[b,t,:] = wte[tok[b,t],:] + wpe[t,:] (wpe
// null: no position table, and no position gradient).
// Layout: tokens [B,T] int32, wte [Vp,C] (padded vocabulary), wpe [Tmax,C].
//
// Vocabulary-parallel (tensor parallelism): wte holds the rows
// [vocab_begin, vocab_begin + vocab_rows) of the whole table. A token
// outside them gives zeros (forward) and no gradient; the one rank holding
// it adds the position too, so the group's sum of outputs is the whole
// embedding, bit for bit (every other term is an exact zero).
#pragma once
#include <cstdint>
#include <limits>

#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

inline constexpr int64_t kWholeVocabulary = std::numeric_limits<int64_t>::max();

// `keep_outside`: a token outside the rows leaves its output as it was
// (the vocabulary's pieces at ZeRO 3, one call each, each row written by
// the piece holding its token).
// `positions` [B*T]: each token's position in its document, where
// documents are masked apart ([data] document_mask); nullptr: position
// t = bt % T, the window's.
inline int64_t position_of(const int32_t* positions, int64_t bt, int64_t Tn) {
  return positions != nullptr ? positions[bt] : bt % Tn;
}

template <class A>
void embedding_forward(A* out, const int32_t* tokens, const A* wte, const A* wpe, int64_t B,
                       int64_t Tn, int64_t C, int64_t vocab_begin = 0,
                       int64_t vocab_rows = kWholeVocabulary, const int32_t* positions = nullptr,
                       bool keep_outside = false) {
  parallel_for("embedding_forward", B * Tn, [=](const int64_t bt) {
    const int64_t t = position_of(positions, bt, Tn), row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
    A* o = out + bt * C;
    if (row < 0 || row >= vocab_rows) {
      if (keep_outside) return;
      for (int64_t c = 0; c < C; ++c) o[c] = st<A>(0.0f);
      return;
    }
    const A* e = wte + row * C;
    if (wpe == nullptr) {  // no position table (rotary positions: Llama)
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
      return;
    }
    const A* p = wpe + t * C;
    for (int64_t c = 0; c < C; ++c) o[c] = st<A>(ld(e[c]) + ld(p[c]));
  });
}

// The vocabulary-parallel embedding without its sum over the group: the
// rows of the positions this rank's vocabulary rows hold, one after
// another, and the move of every rank's rows (gathered) back to their
// positions. `order` lists positions [0, B*T) by the rank holding their
// token (each rank's in increasing position); this rank's are
// order[first, first + count), all of whose tokens are in its rows:
//   rows[k, :] = wte[tok[p] - vocab_begin, :] + wpe[position p, :], p = order[first + k];
//   out[order[k], :] = gathered[k, :] for k < n.
// The bits are those of embedding_forward on the holding rank. A row
// whose token is past `vocab_rows` is left as it was (a vocabulary piece's
// call: embedding_forward's keep_outside).
template <class A>
void embedding_forward_rows(A* rows, const int32_t* tokens, const int32_t* order, int64_t first,
                            int64_t count, const A* wte, const A* wpe, int64_t Tn, int64_t C,
                            int64_t vocab_begin, const int32_t* positions = nullptr,
                            int64_t vocab_rows = kWholeVocabulary) {
  parallel_for("embedding_forward_rows", count, [=](const int64_t k) {
    const int64_t p = order[first + k], row = static_cast<int64_t>(tokens[p]) - vocab_begin;
    if (row < 0 || row >= vocab_rows) return;
    const A* e = wte + row * C;
    A* o = rows + k * C;
    if (wpe == nullptr) {
      for (int64_t c = 0; c < C; ++c) o[c] = e[c];
      return;
    }
    const A* w = wpe + position_of(positions, p, Tn) * C;
    for (int64_t c = 0; c < C; ++c) o[c] = st<A>(ld(e[c]) + ld(w[c]));
  });
}

template <class A>
void scatter_rows(A* out, const A* gathered, const int32_t* order, int64_t n, int64_t C) {
  parallel_for("scatter_rows", n, [=](const int64_t k) {
    const A* g = gathered + k * C;
    A* o = out + static_cast<int64_t>(order[k]) * C;
    for (int64_t c = 0; c < C; ++c) o[c] = g[c];
  });
}

// Parameter gradients (compute type) accumulate (+=) across micro-batches. Parallel over
// channels so that repeated tokens never race and the sum order is fixed.
// Every rank of a tensor group adds the whole position gradient (wpe is
// replicated and dout is the same on all of them).
template <class A, class F = compute_t<A>>
void embedding_backward(F* dwte, F* dwpe, const A* dout, const int32_t* tokens, int64_t B,
                        int64_t Tn, int64_t C, int64_t vocab_begin = 0,
                        int64_t vocab_rows = kWholeVocabulary, const int32_t* positions = nullptr) {
  parallel_for("embedding_backward", C, [=](const int64_t c) {
    for (int64_t bt = 0; bt < B * Tn; ++bt) {
      const F g = ld(dout[bt * C + c]);
      const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
      if (row >= 0 && row < vocab_rows) dwte[row * C + c] += g;
      if (dwpe != nullptr) dwpe[position_of(positions, bt, Tn) * C + c] += g;
    }
  });
}

}  // namespace mpiformer::host
