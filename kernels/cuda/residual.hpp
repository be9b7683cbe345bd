// Residual connection on the GPU (host twin: host/residual.hpp): out = a + b,
// added in float. Its backward is the identity (no kernel), as on the host.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

template <class A>
void residual_forward(A* out, const A* a, const A* b, int64_t n, cudaStream_t stream);

}  // namespace mpiformer::cuda
