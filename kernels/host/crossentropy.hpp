// Softmax cross-entropy over a padded vocabulary.
// Layout: logits [N,Vp]; only the first V columns are real tokens, the rest
// exist so the head GEMM has a friendly shape and are excluded from the
// softmax (their probability and gradient are exactly zero). Logits (and
// their gradient, written in place) are in the storage type A; losses, row
// statistics and the arithmetic in compute_t<A>.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fast_math.hpp"
#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

// losses[n] = -log softmax(logits[n, :V])[targets[n]].
template <class A, class T = compute_t<A>>
void crossentropy_forward(T* losses, const A* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp) {
  parallel_for("crossentropy_forward", N, [=](const int64_t n) {
    const A* z = logits + n * Vp;
    T mx = ld(z[0]);
    for (int64_t i = 1; i < V; ++i) mx = ld(z[i]) > mx ? ld(z[i]) : mx;
    T sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += exp_fast(ld(z[i]) - mx);
    losses[n] = std::log(sum) + mx - ld(z[targets[n]]);
  });
}

// Fused forward and backward, in place: on return logits holds
// dL/dlogits for L = grad_scale * sum_n losses[n], i.e.
// grad_scale * (softmax - onehot(target)); padded columns are zeroed.
// grad_scale is 1 / (tokens in the global batch), which makes the step's loss
// the mean over every token whatever the micro-batch split.
template <class A, class T = compute_t<A>>
void crossentropy_forward_backward(T* losses, A* logits, const int32_t* targets, int64_t N,
                                   int64_t V, int64_t Vp, T grad_scale) {
  if constexpr (kNarrow<A>) {
    // Each row widened into float scratch, worked there as in fp32, and the
    // gradient rounded once on the way back.
    parallel_for("crossentropy_forward_backward", N, [=](const int64_t n) {
      thread_local std::vector<float> scratch;
      if (scratch.size() < static_cast<size_t>(V)) scratch.resize(static_cast<size_t>(V));
      float* w = scratch.data();
      A* z = logits + n * Vp;
      widen_n(w, z, V);
      const T mx = max_of(w, V);
      const int32_t y = targets[n];
      const T zy = w[y];
      const T sum = exp_shift_sum(w, V, mx);
      losses[n] = std::log(sum) + mx - zy;
      const T k = grad_scale / sum;
      for (int64_t i = 0; i < V; ++i) w[i] *= k;
      w[y] -= grad_scale;
      narrow_n(z, w, V);
      for (int64_t i = V; i < Vp; ++i) z[i] = st<A>(T(0));
    });
  } else {
    parallel_for("crossentropy_forward_backward", N, [=](const int64_t n) {
      A* z = logits + n * Vp;
      const T sum = exp_shift_sum(z, V, max_of(z, V));
      const int32_t y = targets[n];
      const T inv = T(1) / sum;
      losses[n] = -std::log(z[y] * inv);
      for (int64_t i = 0; i < V; ++i) z[i] *= inv * grad_scale;
      z[y] -= grad_scale;
      for (int64_t i = V; i < Vp; ++i) z[i] = T(0);
    });
  }
}

// Vocabulary-parallel cross-entropy (tensor parallelism, as Megatron's):
// each rank of a tensor group holds logits [N, Vl] of the columns
// [v0, v0 + Vl) of the padded vocabulary, the first V (<= Vl, maybe 0) of
// them real tokens. The whole logits are never gathered: three passes, with
// an all-reduce of per-row statistics after the first two.
//   1. rowmax[n]: the maximum over this rank's real columns (-inf with none);
//      the group then takes the maximum.
//   2. stats[n]: sum of exp(z - rowmax) over them; stats[N + n]: the
//      target's logit if this rank holds the target, else 0; the group
//      then sums both.
//   3. losses[n] = log(sum) + max - z_target (the same on every rank); with
//      backward, logits becomes grad_scale * (softmax - onehot) on this
//      rank's columns, padding zero.
template <class A, class T = compute_t<A>>
void crossentropy_vp_max(T* rowmax, const A* logits, int64_t N, int64_t V, int64_t Vl) {
  parallel_for("crossentropy_vp_max", N, [=](const int64_t n) {
    const A* z = logits + n * Vl;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t i = 0; i < V; ++i) mx = ld(z[i]) > mx ? ld(z[i]) : mx;
    rowmax[n] = mx;
  });
}

template <class A, class T = compute_t<A>>
void crossentropy_vp_sums(T* stats, const A* logits, const int32_t* targets, const T* rowmax,
                          int64_t N, int64_t V, int64_t Vl, int64_t v0) {
  parallel_for("crossentropy_vp_sums", N, [=](const int64_t n) {
    const A* z = logits + n * Vl;
    T sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += exp_fast(ld(z[i]) - rowmax[n]);
    const int64_t y = static_cast<int64_t>(targets[n]) - v0;
    stats[n] = sum;
    stats[N + n] = y >= 0 && y < V ? ld(z[y]) : T(0);
  });
}

template <class A, class T = compute_t<A>>
void crossentropy_vp_finish(T* losses, A* logits, const int32_t* targets, const T* rowmax,
                            const T* stats, int64_t N, int64_t V, int64_t Vl, int64_t v0,
                            T grad_scale, bool backward) {
  parallel_for("crossentropy_vp_finish", N, [=](const int64_t n) {
    const T mx = rowmax[n], sum = stats[n];
    losses[n] = std::log(sum) + mx - stats[N + n];
    if (!backward) return;
    A* z = logits + n * Vl;
    const T scale = grad_scale / sum;
    const int64_t y = static_cast<int64_t>(targets[n]) - v0;
    if constexpr (kNarrow<A>) {
      // Rounded once, the target's -grad_scale included.
      for (int64_t i = 0; i < V; ++i) {
        const T d = exp_fast(ld(z[i]) - mx) * scale;
        z[i] = st<A>(i == y ? d - grad_scale : d);
      }
      for (int64_t i = V; i < Vl; ++i) z[i] = st<A>(T(0));
    } else {
      for (int64_t i = 0; i < V; ++i) z[i] = exp_fast(z[i] - mx) * scale;
      for (int64_t i = V; i < Vl; ++i) z[i] = T(0);
      if (y >= 0 && y < V) z[y] -= grad_scale;
    }
  });
}

}  // namespace mpiformer::host
