// The GPU's arithmetic of context-parallel ring attention (issue 49): one
// (query chunk, key/value block) pair at a time, the softmax carried
// across blocks in running accumulators. Host twin:
// host/attention_blocks.hpp's ring_attention_* (same layouts, same
// accumulators, the same masks), which the tests check these against;
// the host's are checked against naive attention in double.
//
// Layouts (float: a ring works in float, 16-bit stages widen first):
//   qkv [B, nq, C + 2K]: the query chunk's fused rows (q part read; its
//     first query at global position q0),
//   kv [B, nk, 2K] in A: a key/value block (each row's keys then values,
//     what the ring passes on; its first key at global position k0),
//   m, l, lse, delta [B, NH, nq]; o, out, dout [B, nq, C],
//   dqkv [B, nq, C + 2K] (q part added to), dkv [B, nk, 2K] (added to),
//   starts [B, nq] (device; nullptr: one document per sequence): each
//     query's document's first global position ([data] document_mask).
// A key is seen where its position is at most the query's and not before
// its document's start. A pair no query sees is skipped on the host side
// of the launch.
//
// A: the stage's activation type, whose values the rows hold (widened).
//   float: a warp per query row (forward, dQ) or per key row (dK, dV,
//     summing the kv head's query heads in order), float FMAs;
//   bf16, fp16: the fused attention's 64-row tiles on tensor cores
//     (ring_attention_tiles.cu), the values loaded back into A exactly and
//     the probabilities and scores' gradients rounded to it as the fused
//     kernel rounds them.
// Either way every sum has a fixed order, no atomics: the bits repeat from
// run to run. Head sizes up to 128.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention_shape.hpp"

namespace mpiformer::cuda {

using RingShape = AttentionShape;  // common/attention_shape.hpp

// Before the first block: m = -inf, l = 0, o = 0.
void ring_attention_start(const RingShape& a, int64_t nq, float* m, float* l, float* o,
                          cudaStream_t stream);
// One block into the accumulators.
template <class A>
void ring_attention_forward(const RingShape& a, const float* qkv, int64_t q0, int64_t nq,
                            const A* kv, int64_t k0, int64_t nk, float* m, float* l, float* o,
                            cudaStream_t stream, const int64_t* starts = nullptr);
// After the last block: o becomes the output (o / l), lse = m + log l.
void ring_attention_finish(const RingShape& a, int64_t nq, float* o, const float* m, const float* l,
                           float* lse, cudaStream_t stream);
// Before backward's blocks: delta = rowsum(dout * out).
void ring_attention_delta(const RingShape& a, int64_t nq, const float* out, const float* dout,
                          float* delta, cudaStream_t stream);
// One block's gradients: the queries' into dqkv, the block's keys' and
// values' into dkv (the partial sums a ring passes back to their owner).
template <class A>
void ring_attention_backward(const RingShape& a, const float* qkv, int64_t q0, int64_t nq,
                             const A* kv, int64_t k0, int64_t nk, const float* dout,
                             const float* lse, const float* delta, float* dqkv, float* dkv,
                             cudaStream_t stream, const int64_t* starts = nullptr);

// rows x width elements (float, bf16 or fp16) from src (rows ld_src apart)
// to dst (ld_dst apart): a block's keys and values out of the fused rows,
// and its gradients back.
template <class U>
void copy_rows(U* dst, int64_t ld_dst, const U* src, int64_t ld_src, int64_t rows, int64_t width,
               cudaStream_t stream);
// Under a document mask, each row's document's first position in the
// sequence, from its position in its document (`positions`, [2, B, n]
// chunk-major) and its chunks' first positions (`first`, `second`).
void ring_document_starts(int64_t* starts, const int32_t* positions, int64_t B, int64_t n,
                          int64_t first, int64_t second, cudaStream_t stream);

}  // namespace mpiformer::cuda
