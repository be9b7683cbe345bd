// The compressed all-reduce's kernels on the GPU (host twin and the
// contract: host/grad_compression.hpp; format and arithmetic:
// common/grad_compression.hpp). One thread block per block of
// kQuantBlock elements; `wire` and `out` are device memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

void compress_with_feedback(bool int8, const float* g, float* residual, int64_t n, int parts,
                            uint8_t* wire, cudaStream_t stream);
void sum_compressed(bool int8, const uint8_t* wire, int parts, int64_t c, int64_t valid,
                    float* residual, uint8_t* out, cudaStream_t stream);
void expand_compressed(bool int8, const uint8_t* wire, int parts, int64_t n, float* out,
                       cudaStream_t stream);

}  // namespace mpiformer::cuda
