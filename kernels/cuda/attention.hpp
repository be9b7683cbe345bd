// Causal multi-head self-attention on the GPU (host twin: host/attention.hpp).
// qkv [B,T,3C] (q, k, v; head h uses channels h*hs..), out [B,T,C], att
// [B,NH,T,T] softmax probabilities saved for backward (zero above the
// diagonal).
//
// q, k and v are first permuted to [B,NH,T,hs] so that every (batch, head)
// product is one uniform strided-batched cuBLASLt call; the scores are
// computed in full and masked, like the host (twice the causal FLOPs). A
// fused flash-style kernel that never stores att is the next step for speed.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm.hpp"

namespace mpiformer::cuda {

// Scratch owned by the caller, shared by all layers: 3*B*T*C elements for
// the permuted q, k, v and B*T*C for a permuted output or its gradient;
// backward also needs 3*B*T*C for the permuted dq, dk, dv.
template <class A>
struct AttentionScratch {
  A* qkv;   // [3][B,NH,T,hs]
  A* y;     // [B,NH,T,hs]
  A* dqkv;  // [3][B,NH,T,hs] (backward only)
};

template <class A>
void attention_forward(Blas& blas, A* out, A* att, const A* qkv, const AttentionScratch<A>& s,
                       int64_t B, int64_t T, int64_t C, int64_t NH);

// dqkv is overwritten (=); datt is scratch of the size of att.
template <class A>
void attention_backward(Blas& blas, A* dqkv, A* datt, const A* dout, const A* qkv, const A* att,
                        const AttentionScratch<A>& s, int64_t B, int64_t T, int64_t C,
                        int64_t NH);

}  // namespace mpiformer::cuda
