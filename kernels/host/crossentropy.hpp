// Softmax cross-entropy over a padded vocabulary.
// Layout: logits [N,Vp]; only the first V columns are real tokens, the rest
// exist so the head GEMM has a friendly shape and are excluded from the
// softmax (their probability and gradient are exactly zero).
#pragma once
#include <cmath>
#include <cstdint>

#include "fast_math.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

// losses[n] = -log softmax(logits[n, :V])[targets[n]].
template <class T>
void crossentropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp) {
  parallel_for("crossentropy_forward", N, [=](const int64_t n) {
    const T* z = logits + n * Vp;
    T mx = z[0];
    for (int64_t i = 1; i < V; ++i) mx = z[i] > mx ? z[i] : mx;
    T sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += exp_fast(z[i] - mx);
    losses[n] = std::log(sum) + mx - z[targets[n]];
  });
}

// Fused forward and backward, in place: on return logits holds
// dL/dlogits for L = grad_scale * sum_n losses[n], i.e.
// grad_scale * (softmax - onehot(target)); padded columns are zeroed.
// grad_scale is 1 / (tokens in the global batch), which makes the step's loss
// the mean over every token whatever the micro-batch split.
template <class T>
void crossentropy_forward_backward(T* losses, T* logits, const int32_t* targets, int64_t N,
                                   int64_t V, int64_t Vp, T grad_scale) {
  parallel_for("crossentropy_forward_backward", N, [=](const int64_t n) {
    T* z = logits + n * Vp;
    T mx = z[0];
    for (int64_t i = 1; i < V; ++i) mx = z[i] > mx ? z[i] : mx;
    T sum = 0;
    for (int64_t i = 0; i < V; ++i) {
      z[i] = exp_fast(z[i] - mx);
      sum += z[i];
    }
    const int32_t y = targets[n];
    const T inv = T(1) / sum;
    losses[n] = -std::log(z[y] * inv);
    for (int64_t i = 0; i < V; ++i) z[i] *= inv * grad_scale;
    z[y] -= grad_scale;
    for (int64_t i = V; i < Vp; ++i) z[i] = T(0);
  });
}

}  // namespace mpiformer::host
