// What an op set's attention keeps from its forward for its backward, and
// the scratch its backward needs, written once: the stage allocates both
// from here and the memory accounting (stage_footprint) counts them from
// here.
//  - kProbabilities (the host): the softmax probabilities of every head,
//    [B, NH, T, T] of the activation type, and as much scratch for their
//    gradient.
//  - kRowStatistics (the GPU's fused attention): each query row's
//    log-sum-exp, [B, NH, T] floats, and as much scratch for the rows'
//    dot(dO, O); the T x T scores are recomputed in tiles, never stored.
#pragma once
#include <cstdint>

namespace mpiformer {

enum class AttentionStorage { kProbabilities, kRowStatistics };

// Elements of the kept state, and of the backward's scratch: an int64_t
// count for the stage's allocation, a double for the accounting (a deck's
// batch is not bounded so that every product fits an integer).
template <class N>
N attention_state_elements(AttentionStorage s, N B, N NH, N T) {
  return s == AttentionStorage::kProbabilities ? B * NH * T * T : B * NH * T;
}

}  // namespace mpiformer
