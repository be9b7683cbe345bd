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
// `param_offset`: where the chunk's parameters are, when they live apart
// from its gradients and moments (fp32 under ZeRO 1-2: the shard's master
// weights are the stage's own weights, not a copy); else `offset`.
struct AdamWChunk {
  int64_t offset;
  int64_t param_offset;
  int32_t length;
  int32_t decay;  // 1: weight decay applies (matrices, embeddings)
};

// Small enough that a GPU block or a host task covers a chunk, large enough
// that the list stays short (a few thousand entries for GPT-2 124M).
constexpr int32_t kAdamWChunkElements = 1 << 14;

// Appends [offset, offset + n) as chunks of at most kAdamWChunkElements,
// their parameters at [param_offset, param_offset + n).
inline void append_adamw_chunks(std::vector<AdamWChunk>& chunks, int64_t offset, int64_t n,
                                bool decay, int64_t param_offset) {
  for (int64_t o = 0; o < n; o += kAdamWChunkElements) {
    const auto len = static_cast<int32_t>(std::min<int64_t>(kAdamWChunkElements, n - o));
    chunks.push_back(AdamWChunk{offset + o, param_offset + o, len, decay ? 1 : 0});
  }
}
inline void append_adamw_chunks(std::vector<AdamWChunk>& chunks, int64_t offset, int64_t n,
                                bool decay) {
  append_adamw_chunks(chunks, offset, n, decay, offset);
}

namespace host {
using mpiformer::AdamWParams;
}

}  // namespace mpiformer
