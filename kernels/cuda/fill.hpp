// Random values on the device, for timing: some GPUs run measurably faster
// on zeros or constants than on real data (an H200 was reported at 894 vs
// 788 TFLOP/s for a bf16 GEMM), so a peak timed on them would make MFU read
// low.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/precision.hpp"

namespace mpiformer::cuda {

// p[i] uniform in [-1, 1), from a hash of (seed, i): the same values on
// every device and launch shape.
void fill_random(float* p, int64_t n, uint64_t seed, cudaStream_t stream);
void fill_random(bf16* p, int64_t n, uint64_t seed, cudaStream_t stream);
void fill_random(fp16* p, int64_t n, uint64_t seed, cudaStream_t stream);

}  // namespace mpiformer::cuda
