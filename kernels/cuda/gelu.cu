#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/gelu.hpp"

namespace mpiformer::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

template <class A>
__global__ void gelu_forward_kernel(A* out, const A* inp, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = to_float(inp[i]);
  out[i] = from_float<A>(0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x))));
}

template <class A>
__global__ void gelu_backward_kernel(A* dinp, const A* inp, const A* dout, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float x = to_float(inp[i]);
  const float th = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  const float du = kSqrt2OverPi * (1.f + 3.f * kCubic * x * x);
  const float local = 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * du;
  dinp[i] = from_float<A>(to_float(dout[i]) * local);
}

}  // namespace

template <class A>
void gelu_forward(A* out, const A* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, inp, n);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void gelu_backward(A* dinp, const A* inp, const A* dout, int64_t n, cudaStream_t stream) {
  gelu_backward_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dinp, inp, dout, n);
  CUDA_CHECK_LAUNCH();
}

template void gelu_forward<float>(float*, const float*, int64_t, cudaStream_t);
template void gelu_forward<bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void gelu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);

}  // namespace mpiformer::cuda
