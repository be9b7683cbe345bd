// What an op set's attention keeps from its forward for its backward, and
// the scratch its backward needs, written once: the stage allocates both
// from here and the memory accounting (stage_footprint) counts them from
// here.
//  - kProbabilities (the host): the softmax probabilities of every head,
//    [B, NH, T, T] of the activation type, and as much scratch for their
//    gradient.
//  - kRowStatistics (the GPU's fused attention): each query row's
//    log-sum-exp, [B, NH, T] floats; its backward's scratch holds the
//    rows' dot(dO, O), dQ's float sum over key tiles (as large as the
//    queries) and a flag per query tile (attention_scratch_layout); the
//    T x T scores are recomputed in tiles, never stored.
#pragma once
#include <cstdint>

namespace mpiformer {

enum class AttentionStorage { kProbabilities, kRowStatistics };

// What a stage keeps with its op set's attention `kernel` under context
// parallelism of `cp`: the ring (train/ring_attention.hpp) keeps each
// query row's log-sum-exp whatever the device, and needs no scratch of
// the stage's (its buffers are its own).
inline AttentionStorage stage_attention_storage(AttentionStorage kernel, int64_t cp) {
  return cp > 1 ? AttentionStorage::kRowStatistics : kernel;
}

// Elements of the kept state, and of the backward's scratch: an int64_t
// count for the stage's allocation, a double for the accounting (a deck's
// batch is not bounded so that every product fits an integer).
template <class N>
N attention_state_elements(AttentionStorage s, N B, N NH, N T) {
  return s == AttentionStorage::kProbabilities ? B * NH * T * T : B * NH * T;
}

// The fused attention's tile: query rows and keys a block takes at a time
// (cuda/attention.cu), and the unit of its backward's turn flags.
constexpr int kAttentionTile = 64;

// The fused backward's scratch, in floats from its start: each row's
// dot(dO, O) [B, NH, T]; dQ's float sum over key tiles [B, NH, T, hs];
// a turn flag (a 32-bit word) per query tile [B, NH, T / tile rounded up].
struct AttentionScratch {
  int64_t delta, dq_sum, turns, turn_count, total;
};
inline AttentionScratch attention_scratch_layout(int64_t B, int64_t NH, int64_t T, int64_t hs) {
  AttentionScratch s{};
  s.delta = 0;
  s.dq_sum = B * NH * T;
  s.turns = s.dq_sum + B * NH * T * hs;
  s.turn_count = B * NH * ((T + kAttentionTile - 1) / kAttentionTile);
  s.total = s.turns + s.turn_count;
  return s;
}

// Elements of the backward's scratch: the host's probabilities' gradient
// (as many as the kept state), or the fused layout above. A double for the
// accounting, an int64_t for the stage.
template <class N>
N attention_scratch_elements(AttentionStorage s, N B, N NH, N T, N hs) {
  if (s == AttentionStorage::kProbabilities) return attention_state_elements(s, B, NH, T);
  const N tiles = static_cast<N>((static_cast<int64_t>(T) + kAttentionTile - 1) / kAttentionTile);
  return B * NH * T * (1 + hs) + B * NH * tiles;
}

// The context ring's blocks (host/attention_blocks.hpp): a (sequence, kv
// head) task takes `tile` query rows at a time, its scores and in backward
// their gradients tile x (the block's keys) each, so a long chunk's pair
// never holds an n x n matrix. Its scratch, for B x NKV tasks, query
// blocks of nq rows and key blocks of nk (a double for the accounting, an
// int64_t for the ring).
constexpr int64_t kRingQueryTile = 256;
template <class N>
N ring_scratch_elements(N B, N NKV, N nq, N nk, N tile = static_cast<N>(kRingQueryTile)) {
  return B * NKV * 2 * (tile < nq ? tile : nq) * nk;
}

}  // namespace mpiformer
