// Linear layer on the GPU (host twin: host/matmul.hpp):
// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC], bias fused into the
// cuBLASLt call. Inputs, weights (the activation-type copy of the master
// weights) and outputs are of the activation type; the weight and bias
// gradients are float and accumulate (+=) across micro-batches.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm.hpp"

namespace mpiformer::cuda {

// `ld`: out's (dout's) row stride, 0 for OC (host/matmul.hpp's).
template <class A>
void matmul_forward(Blas& blas, A* out, const A* inp, const A* weight, const A* bias, int64_t N,
                    int64_t C, int64_t OC, int64_t ld = 0);

// dinp is overwritten (=) and may be null; dweight and dbias may be null
// (the input gradient alone: host/matmul.hpp).
template <class A>
void matmul_backward(Blas& blas, A* dinp, float* dweight, float* dbias, const A* dout,
                     const A* inp, const A* weight, int64_t N, int64_t C, int64_t OC,
                     int64_t ld = 0);

// The input gradient in float, = or (`accumulate`) += (host/matmul.hpp's).
template <class A>
void matmul_input_grad(Blas& blas, float* dinp, bool accumulate, const A* dout, const A* weight,
                       int64_t N, int64_t C, int64_t OC, int64_t ld);

}  // namespace mpiformer::cuda
