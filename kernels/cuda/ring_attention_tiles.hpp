// The ring's blocks on tensor cores for 16-bit stages (ring_attention_tiles.cu):
// what ring_attention.cu's forward and backward launch when the rows hold
// values of S (bf16 or fp16) widened to float and the key/value blocks are
// in S. Same layouts and accumulators as ring_attention.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention_shape.hpp"

namespace mpiformer::cuda {

template <class S>
void ring_tiles_forward(const AttentionShape& a, const float* qkv, int64_t q0, int64_t nq,
                        const S* kv, int64_t k0, int64_t nk, float* m, float* l, float* o,
                        cudaStream_t stream, const int64_t* starts);
template <class S>
void ring_tiles_backward(const AttentionShape& a, const float* qkv, int64_t q0, int64_t nq,
                         const S* kv, int64_t k0, int64_t nk, const float* dout,
                         const float* lse, const float* delta, float* dqkv, float* dkv,
                         cudaStream_t stream, const int64_t* starts);

}  // namespace mpiformer::cuda
