// Causal multi-head self-attention on the GPU, fused (host twin:
// host/attention.hpp, which keeps the probabilities; the results agree to
// rounding), grouped-query: NH query heads share NKV kv heads (query head
// h reads kv head h / (NH / NKV)). qkv [B,T,C+2K] (q [C = NH*hs], k, v
// [K = NKV*hs each]; head h uses channels h*hs.. of its part), out [B,T,C],
// both read and written in place: no permuted copies. The key kernel runs
// per kv head and sums its group's query heads in float.
//
// Forward (FlashAttention's online softmax): each block of threads takes a
// tile of query rows of one (batch, head) and walks the key tiles up to the
// diagonal, keeping the running row maximum and sum; the T x T scores exist
// only as a tile in shared memory. It keeps each row's log-sum-exp, lse
// [B,NH,T] floats, for backward: memory O(B*T*C), not O(B*NH*T^2).
//
// Backward recomputes the probabilities of each tile from q, k and lse. It
// runs as two kernels, so that no two blocks add into the same gradient
// (no atomics: the bits repeat from run to run): one per key tile (dK, dV:
// walks the query tiles at and below the diagonal), one per query tile
// (dQ: walks the key tiles). `delta` [B,NH,T] floats is scratch for each
// row's dot(dO, O).
//
// Products of tiles run on tensor cores (wmma, bf16 in, float accumulate)
// for bf16 on sm_80 and newer, and as float FMAs otherwise (fp32, and
// every build that compiles them for the host). Head sizes up to 128.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

template <class A>
void attention_forward(A* out, float* lse, const A* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t NKV, cudaStream_t stream);

// dqkv is overwritten (=); out and lse are the forward's.
template <class A>
void attention_backward(A* dqkv, float* delta, const A* dout, const A* qkv, const A* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int64_t NKV, cudaStream_t stream);

}  // namespace mpiformer::cuda
