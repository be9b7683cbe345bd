// Token + position embedding. out[b,t,:] = wte[tok[b,t],:] + wpe[t,:].
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

template <class A>
void embedding_forward(A* out, const int32_t* tokens, const A* wte, const A* wpe, int64_t B,
                       int64_t Tn, int64_t C, int64_t vocab_begin = 0,
                       int64_t vocab_rows = kWholeVocabulary) {
  parallel_for("embedding_forward", B * Tn, [=](const int64_t bt) {
    const int64_t t = bt % Tn, row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
    A* o = out + bt * C;
    if (row < 0 || row >= vocab_rows) {
      for (int64_t c = 0; c < C; ++c) o[c] = st<A>(0.0f);
      return;
    }
    const A* e = wte + row * C;
    const A* p = wpe + t * C;
    for (int64_t c = 0; c < C; ++c) o[c] = st<A>(ld(e[c]) + ld(p[c]));
  });
}

// Parameter gradients (compute type) accumulate (+=) across micro-batches. Parallel over
// channels so that repeated tokens never race and the sum order is fixed.
// Every rank of a tensor group adds the whole position gradient (wpe is
// replicated and dout is the same on all of them).
template <class A, class F = compute_t<A>>
void embedding_backward(F* dwte, F* dwpe, const A* dout, const int32_t* tokens, int64_t B,
                        int64_t Tn, int64_t C, int64_t vocab_begin = 0,
                        int64_t vocab_rows = kWholeVocabulary) {
  parallel_for("embedding_backward", C, [=](const int64_t c) {
    for (int64_t bt = 0; bt < B * Tn; ++bt) {
      const F g = ld(dout[bt * C + c]);
      const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
      if (row >= 0 && row < vocab_rows) dwte[row * C + c] += g;
      dwpe[(bt % Tn) * C + c] += g;
    }
  });
}

}  // namespace mpiformer::host
