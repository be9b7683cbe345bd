// AdamW on the GPU (host twin: host/adamw.hpp): one fused pass over a
// contiguous range of float master weights, gradients and moments. When
// `copy` is given it also writes the updated weights in the activation type
// (the bf16 copy the matmuls read), so no second pass is needed.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/adamw_params.hpp"

namespace mpiformer::cuda {

template <class A>
void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  const AdamWParams& p, A* copy, cudaStream_t stream);

// Every chunk in one launch; `chunks` (count of them) is device memory, and
// p.weight_decay applies to the chunks flagged `decay`; those flagged
// `narrow` read their gradients from `grads16` ([train] grad_dtype).
template <class A>
void adamw_update_chunks(float* params, const float* grads, float* m, float* v,
                         const AdamWChunk* chunks, int64_t count, const AdamWParams& p, A* copy,
                         cudaStream_t stream, const A* grads16 = nullptr);

// dst[i] = src[i] in the activation type (refreshing the matmul copy of the
// weights after initialisation or a restore).
template <class A>
void convert(A* dst, const float* src, int64_t n, cudaStream_t stream);

}  // namespace mpiformer::cuda
