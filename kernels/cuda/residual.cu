#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/residual.hpp"

namespace mpiformer::cuda {

namespace {

template <class A>
__global__ void residual_forward_kernel(A* out, const A* a, const A* b, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = from_float<A>(to_float(a[i]) + to_float(b[i]));
}

}  // namespace

template <class A>
void residual_forward(A* out, const A* a, const A* b, int64_t n, cudaStream_t stream) {
  residual_forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, a, b, n);
  CUDA_CHECK_LAUNCH();
}

template void residual_forward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void residual_forward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);

}  // namespace mpiformer::cuda
