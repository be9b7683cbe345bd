// Residual connection on the GPU (host twin: host/residual.hpp): out = a + b,
// added in float. Its backward is the identity (no kernel), as on the host.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

template <class A>
void residual_forward(A* out, const A* a, const A* b, int64_t n, cudaStream_t stream);

// dst += src, added in float and rounded once to dst's type (host twin:
// host/residual.hpp's add_into): float += float (ZeRO's shards), and for
// 16-bit gradients A += float and float += A.
template <class D, class S>
void add_into(D* dst, const S* src, int64_t n, cudaStream_t stream);

}  // namespace mpiformer::cuda
