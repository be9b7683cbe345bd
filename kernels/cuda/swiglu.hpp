// SwiGLU (Llama's MLP activation) on the GPU (host twin: host/swiglu.hpp):
// inp [N, 2F] (gate, then up, per row), out [N, F].
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

template <class A>
void swiglu_forward(A* out, const A* inp, int64_t N, int64_t F, cudaStream_t stream);

// dinp [N, 2F] is overwritten (=); it may be inp itself.
template <class A>
void swiglu_backward(A* dinp, const A* inp, const A* dout, int64_t N, int64_t F,
                     cudaStream_t stream);

}  // namespace mpiformer::cuda
