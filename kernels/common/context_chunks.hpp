// Which 2 of a sequence's 2 cp chunks context rank r holds. Head-tail
// (the default): chunks r and 2 cp - 1 - r, one from the front and one
// from the back, so that under the causal mask every rank's queries see
// as many keys (Megatron's and torchtitan's order). Contiguous: chunks
// 2 r and 2 r + 1, the plain split, whose last rank attends to the most
// keys and paces the ring (kept for comparison). The data feeder lays a
// rank's tokens out by it and the ring attends by it; the routers of both
// back ends count a sequence's experts by it. Written once for host and
// device code.
#pragma once
#include <cstdint>

#include "core/settings.hpp"

#if defined(__CUDACC__)
#define MPIFORMER_CHUNK_FN __host__ __device__ __forceinline__
#else
#define MPIFORMER_CHUNK_FN inline
#endif

namespace mpiformer {

struct ContextChunkPair {
  int64_t first, second;
};
MPIFORMER_CHUNK_FN ContextChunkPair context_chunks(int64_t rank, int64_t cp,
                                       ContextChunks order = ContextChunks::kHeadTail) {
  if (order == ContextChunks::kContiguous) return {2 * rank, 2 * rank + 1};
  return {rank, 2 * cp - 1 - rank};
}

// The inverse: which rank holds chunk g of 2 cp, and as which of its two
// (0: first, 1: second).
struct ContextChunkOwner {
  int64_t rank, which;
};
MPIFORMER_CHUNK_FN ContextChunkOwner context_chunk_owner(int64_t g, int64_t cp,
                                             ContextChunks order = ContextChunks::kHeadTail) {
  if (order == ContextChunks::kContiguous) return {g / 2, g % 2};
  return g < cp ? ContextChunkOwner{g, 0} : ContextChunkOwner{2 * cp - 1 - g, 1};
}

// Under a document mask, the first position in the sequence of the
// document that row `row` of a rank's [2, B, n] chunk-major rows is in:
// the row's own position there (its chunk's first position, `first` or
// `second`, plus its place in the chunk) less its position in its
// document (`position`).
MPIFORMER_CHUNK_FN int64_t context_document_start(int64_t row, int64_t B, int64_t n, int64_t first,
                                                  int64_t second, int32_t position) {
  return (row < B * n ? first : second) + row % n - position;
}

}  // namespace mpiformer
