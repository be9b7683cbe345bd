// Moving tokens to their experts and back on the GPU (host twin, with the
// layouts and the router's dispatch rows: host/moe_dispatch.hpp). A: the
// activation type; the gates are float (the router's).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

// dst[i] = src[i] in float (the router's logits, which its GEMM leaves in
// the activation type).
template <class A>
void widen(float* dst, const A* src, int64_t n, cudaStream_t stream);

// buf[dest[a]] = x[n] for every kept assignment a of token n.
template <class A>
void moe_dispatch_forward(A* buf, const A* x, const int32_t* dest, int64_t N, int64_t K,
                          int64_t C, cudaStream_t stream);
// dx [N, C] accumulates (+=) the gradients of each kept copy.
template <class A>
void moe_dispatch_backward(A* dx, const A* dbuf, const int32_t* dest, int64_t N, int64_t K,
                           int64_t C, cudaStream_t stream);
// y [N, C] (=): the gate-weighted sum of each token's kept expert outputs.
template <class A>
void moe_combine_forward(A* y, const A* out, const float* gate, const int32_t* dest, int64_t N,
                         int64_t K, int64_t C, cudaStream_t stream);
// dout [M, C] (=) at every kept row; dgate [N k] (=), zero where dropped.
template <class A>
void moe_combine_backward(A* dout, float* dgate, const A* dy, const A* out, const float* gate,
                          const int32_t* dest, int64_t N, int64_t K, int64_t C,
                          cudaStream_t stream);

}  // namespace mpiformer::cuda
