// LayerNorm over the last dimension on the GPU (host twin: host/layernorm.hpp),
// eps 1e-5. inp/out [N,C] of the activation type, weight/bias [C], mean/rstd
// [N] in float, saved for backward. Statistics are computed in float.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/device.hpp"

namespace mpiformer::cuda {

template <class A>
void layernorm_forward(A* out, float* mean, float* rstd, const A* inp, const A* weight,
                       const A* bias, int64_t N, int64_t C, cudaStream_t stream);

// dinp is ACCUMULATED (+=), as on the host: it is the residual stream's
// gradient. dweight/dbias (float) accumulate across micro-batches; their
// column sums use `scratch` (2 x 32 x C floats at most) to fill the GPU.
template <class A>
void layernorm_backward(A* dinp, float* dweight, float* dbias, const A* dout, const A* inp,
                        const A* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, const DeviceScratch& scratch, cudaStream_t stream);

}  // namespace mpiformer::cuda
