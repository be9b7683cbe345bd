// RMSNorm (Llama) on the GPU (host twin: host/rmsnorm.hpp, whose layouts
// and semantics these follow: dinp accumulates, dweight accumulates).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device.hpp"

namespace mpiformer::cuda {

template <class A>
void rmsnorm_forward(A* out, float* rstd, const A* inp, const A* weight, int64_t N, int64_t C,
                     float eps, cudaStream_t stream);

template <class A>
void rmsnorm_backward(A* dinp, float* dweight, const A* dout, const A* inp, const A* weight,
                      const float* rstd, int64_t N, int64_t C, const DeviceScratch& scratch,
                      cudaStream_t stream);

}  // namespace mpiformer::cuda
