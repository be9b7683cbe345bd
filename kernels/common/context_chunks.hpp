// Which 2 of a sequence's 2 cp chunks context rank r holds. Head-tail
// (the default): chunks r and 2 cp - 1 - r, one from the front and one
// from the back, so that under the causal mask every rank's queries see
// as many keys (Megatron's and torchtitan's order). Contiguous: chunks
// 2 r and 2 r + 1, the plain split, whose last rank attends to the most
// keys and paces the ring (kept for comparison). The data feeder lays a
// rank's tokens out by it and the ring attends by it.
#pragma once
#include <cstdint>

#include "core/settings.hpp"

namespace mpiformer::host {

struct ContextChunkPair {
  int64_t first, second;
};
inline ContextChunkPair context_chunks(int64_t rank, int64_t cp,
                                       ContextChunks order = ContextChunks::kHeadTail) {
  if (order == ContextChunks::kContiguous) return {2 * rank, 2 * rank + 1};
  return {rank, 2 * cp - 1 - rank};
}

// The inverse: which rank holds chunk g of 2 cp, and as which of its two
// (0: first, 1: second).
struct ContextChunkOwner {
  int64_t rank, which;
};
inline ContextChunkOwner context_chunk_owner(int64_t g, int64_t cp,
                                             ContextChunks order = ContextChunks::kHeadTail) {
  if (order == ContextChunks::kContiguous) return {g / 2, g % 2};
  return g < cp ? ContextChunkOwner{g, 0} : ContextChunkOwner{2 * cp - 1 - g, 1};
}

}  // namespace mpiformer::host
