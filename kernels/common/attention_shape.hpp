// The heads of one micro-batch's attention as a context-parallel ring
// carries them: B sequences, C query channels in NH heads, NKV key/value
// heads (grouped-query: query head h reads kv head h / (NH / NKV)). Shared
// by the host's ring blocks (host/attention_blocks.hpp), the GPU's
// (cuda/ring_attention.hpp) and the ring that drives either.
#pragma once
#include <cstdint>

namespace mpiformer {

struct AttentionShape {
  int64_t B, C, NH, NKV;
  int64_t hs() const { return C / NH; }
  int64_t K() const { return NKV * hs(); }
  int64_t group() const { return NH / NKV; }
};

}  // namespace mpiformer
