// Causal multi-head self-attention on the GPU, fused (host twin:
// host/attention.hpp, which keeps the probabilities; the results agree to
// rounding), grouped-query: NH query heads share NKV kv heads (query head
// h reads kv head h / (NH / NKV)). qkv [B,T,C+2K] (q [C = NH*hs], k, v
// [K = NKV*hs each]; head h uses channels h*hs.. of its part), out [B,T,C],
// both read and written in place: no permuted copies. The key kernel runs
// per kv head and sums its group's query heads in float.
//
// Forward (FlashAttention-2's scheme): each block of threads takes a tile
// of 64 query rows of one (batch, head) and walks the key tiles up to the
// diagonal, keeping the running row maximum and sum; the T x T scores
// exist only as register tiles. It keeps each row's log-sum-exp, lse
// [B,NH,T] floats, for backward: memory O(B*T*C), not O(B*NH*T^2).
//
// Backward recomputes each tile's probabilities from q, k and lse, in one
// kernel of five tile products: a block per key tile (dK, dV in its
// registers) walks the query tiles at and below the diagonal, and adds
// its part of dQ into a float sum in key-tile order (turn flags, no
// atomics: the bits repeat from run to run). `scratch` holds
// attention_scratch_elements(kRowStatistics, B, NH, T, hs) floats
// (common/attention_storage.hpp): each row's dot(dO, O), dQ's sum, the
// flags.
//
// Tile products run on tensor cores (mma.sync, bf16/fp16 in, float
// accumulate) on sm_80 and newer, and as float FMAs in fp32 (never
// TF32) and in every build that compiles them for the host. Head sizes
// up to 128.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

// `positions` [B*T] (device; nullptr: none): each token's position in its
// document; row t then attends to keys t - positions[t] .. t only
// ([data] document_mask). The backward takes the forward's.
template <class A>
void attention_forward(A* out, float* lse, const A* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t NKV, cudaStream_t stream,
                       const int32_t* positions = nullptr);

// dqkv is overwritten (=); out and lse are the forward's.
template <class A>
void attention_backward(A* dqkv, float* scratch, const A* dout, const A* qkv, const A* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int64_t NKV, cudaStream_t stream, const int32_t* positions = nullptr);

}  // namespace mpiformer::cuda
