// What both AdamW kernels (host and CUDA) consume: the settings of one
// update and the optimizer's description of a stage, a list of chunks.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace mpiformer {

struct AdamWParams {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;  // applied to the chunks flagged `decay` only
  int64_t step;         // 1-based, for bias correction
  double grad_scale;    // multiplies every gradient first (clipping)
};

// A contiguous run of parameters that share one decay rule. A stage's
// update is a list of these, so every tensor goes in one pass (one launch
// on a GPU instead of hundreds of small ones for the biases). Only logical
// elements are listed: wte's padded rows are never touched and stay zero.
// Each array the update reads or writes has its own offset, because ZeRO
// keeps them in different orders (train/zero_shards.hpp): the moments at
// `offset` (the state's order); the master weights at `param_offset` (fp32
// under ZeRO 1-2: the stage's own weights); the gradients at `grad_offset`
// (ZeRO 1: the owned rows of the stage's whole gradients, reduced there in
// place); the 16-bit copy at `copy_offset` (ZeRO 1-2: the owned rows of
// the stage's whole weights, which the all-gather then reads in place).
struct AdamWChunk {
  int64_t offset;
  int64_t param_offset;
  int64_t grad_offset;
  int64_t copy_offset;
  int32_t length;
  int32_t decay;  // 1: weight decay applies (matrices, embeddings)
  // 1: the gradients are 16-bit, in the update's second gradient array
  // ([train] grad_dtype = bf16: zero 1's blocks, reduced in their sums).
  int32_t narrow = 0;
};

// Where one run of elements starts in each array (AdamWChunk's offsets).
struct AdamWPlaces {
  int64_t state, param, grad, copy;
};

// Small enough that a GPU block or a host task covers a chunk, large enough
// that the list stays short (a few thousand entries for GPT-2 124M).
constexpr int32_t kAdamWChunkElements = 1 << 14;

// Appends n elements from `at` as chunks of at most kAdamWChunkElements.
inline void append_adamw_chunks(std::vector<AdamWChunk>& chunks, AdamWPlaces at, int64_t n,
                                bool decay, bool narrow = false) {
  for (int64_t o = 0; o < n; o += kAdamWChunkElements) {
    const auto len = static_cast<int32_t>(std::min<int64_t>(kAdamWChunkElements, n - o));
    chunks.push_back(AdamWChunk{at.state + o, at.param + o, at.grad + o, at.copy + o, len,
                                decay ? 1 : 0, narrow ? 1 : 0});
  }
}
// The masters at param_offset, everything else at `offset`.
inline void append_adamw_chunks(std::vector<AdamWChunk>& chunks, int64_t offset, int64_t n,
                                bool decay, int64_t param_offset) {
  append_adamw_chunks(chunks, AdamWPlaces{offset, param_offset, offset, offset}, n, decay);
}
inline void append_adamw_chunks(std::vector<AdamWChunk>& chunks, int64_t offset, int64_t n,
                                bool decay) {
  append_adamw_chunks(chunks, offset, n, decay, offset);
}

namespace host {
using mpiformer::AdamWParams;
}

}  // namespace mpiformer
