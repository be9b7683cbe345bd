// SwiGLU: a thread per (row, channel) pair of gate and up.
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/swiglu.hpp"

namespace mpiformer::cuda {

namespace {

template <class A>
__global__ void swiglu_forward_kernel(A* out, const A* inp, int64_t N, int64_t F) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= N * F) return;
  const int64_t n = e / F, i = e % F;
  const float x = to_float(inp[n * 2 * F + i]), up = to_float(inp[n * 2 * F + F + i]);
  out[e] = from_float<A>(x / (1.f + expf(-x)) * up);
}

template <class A>
__global__ void swiglu_backward_kernel(A* dinp, const A* inp, const A* dout, int64_t N, int64_t F) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= N * F) return;
  const int64_t n = e / F, i = e % F;
  // Both inputs read before either gradient is written (dinp may be inp).
  const float x = to_float(inp[n * 2 * F + i]), up = to_float(inp[n * 2 * F + F + i]);
  const float dy = to_float(dout[e]);
  const float sig = 1.f / (1.f + expf(-x));
  dinp[n * 2 * F + i] = from_float<A>(dy * up * sig * (1.f + x * (1.f - sig)));
  dinp[n * 2 * F + F + i] = from_float<A>(dy * x * sig);
}

}  // namespace

template <class A>
void swiglu_forward(A* out, const A* inp, int64_t N, int64_t F, cudaStream_t stream) {
  if (N * F == 0) return;
  swiglu_forward_kernel<<<blocks_for(N * F, 256), 256, 0, stream>>>(out, inp, N, F);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void swiglu_backward(A* dinp, const A* inp, const A* dout, int64_t N, int64_t F,
                     cudaStream_t stream) {
  if (N * F == 0) return;
  swiglu_backward_kernel<<<blocks_for(N * F, 256), 256, 0, stream>>>(dinp, inp, dout, N, F);
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                          \
  template void swiglu_forward<A>(A*, const A*, int64_t, int64_t, cudaStream_t);          \
  template void swiglu_backward<A>(A*, const A*, const A*, int64_t, int64_t, cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
