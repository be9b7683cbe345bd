// GELU (tanh approximation, GPT-2) on the GPU (host twin: host/gelu.hpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

template <class A>
void gelu_forward(A* out, const A* inp, int64_t n, cudaStream_t stream);

// dinp is overwritten (=); it may alias dout.
template <class A>
void gelu_backward(A* dinp, const A* inp, const A* dout, int64_t n, cudaStream_t stream);

}  // namespace mpiformer::cuda
