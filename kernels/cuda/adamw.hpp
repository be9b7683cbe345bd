// AdamW on the GPU (host twin: host/adamw.hpp): one fused pass over a
// contiguous range of float master weights, gradients and moments. When
// `copy` is given it also writes the updated weights in the activation type
// (the bf16 copy the matmuls read), so no second pass is needed.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "host/adamw_params.hpp"

namespace mpiformer::cuda {

template <class A>
void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  const AdamWParams& p, A* copy, cudaStream_t stream);

// A contiguous run of parameters sharing one weight decay; a model's update
// is a list of these, so all its tensors go in one launch instead of one
// launch per tensor (hundreds of small launches for the biases).
struct AdamWChunk {
  int64_t offset;
  int32_t length;
  float weight_decay;
};
constexpr int32_t kAdamWChunkElements = 1 << 14;
// Appends [offset, offset + n) as chunks of at most kAdamWChunkElements.
void append_adamw_chunks(std::vector<AdamWChunk>& chunks, int64_t offset, int64_t n,
                         double weight_decay);
// Every chunk in one launch; `chunks` (count of them) is device memory, and
// p.weight_decay is ignored (each chunk has its own).
template <class A>
void adamw_update_chunks(float* params, const float* grads, float* m, float* v,
                         const AdamWChunk* chunks, int64_t count, const AdamWParams& p, A* copy,
                         cudaStream_t stream);

// dst[i] = src[i] in the activation type (refreshing the matmul copy of the
// weights after initialisation or a restore).
template <class A>
void convert(A* dst, const float* src, int64_t n, cudaStream_t stream);

}  // namespace mpiformer::cuda
