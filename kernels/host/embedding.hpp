// Token + position embedding. out[b,t,:] = wte[tok[b,t],:] + wpe[t,:].
// Layout: tokens [B,T] int32, wte [Vp,C] (padded vocabulary), wpe [Tmax,C].
#pragma once
#include <cstdint>

#include "parallel.hpp"

namespace mpiformer::host {

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                       int64_t Tn, int64_t C) {
  parallel_for("embedding_forward", B * Tn, [=](const int64_t bt) {
    const int64_t t = bt % Tn;
    const T* e = wte + static_cast<int64_t>(tokens[bt]) * C;
    const T* p = wpe + t * C;
    T* o = out + bt * C;
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  });
}

// Parameter gradients accumulate (+=) across micro-batches. Parallel over
// channels so that repeated tokens never race and the sum order is fixed.
template <class T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B,
                        int64_t Tn, int64_t C) {
  parallel_for("embedding_backward", C, [=](const int64_t c) {
    for (int64_t bt = 0; bt < B * Tn; ++bt) {
      const T g = dout[bt * C + c];
      dwte[static_cast<int64_t>(tokens[bt]) * C + c] += g;
      dwpe[(bt % Tn) * C + c] += g;
    }
  });
}

}  // namespace mpiformer::host
