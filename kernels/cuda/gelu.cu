#include "core/cuda_check.hpp"
#include "cuda/elementwise.cuh"
#include "cuda/gelu.hpp"

namespace mpiformer::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

struct GeluForward {
  __device__ float operator()(float x, float) const {
    return 0.5f * x * (1.f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
};

// (x, dout) -> dinp.
struct GeluBackward {
  __device__ float operator()(float x, float dout) const {
    const float th = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float du = kSqrt2OverPi * (1.f + 3.f * kCubic * x * x);
    return dout * (0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * du);
  }
};

}  // namespace

template <class A>
void gelu_forward(A* out, const A* inp, int64_t n, cudaStream_t stream) {
  launch_elementwise(out, inp, static_cast<const A*>(nullptr), n, GeluForward{}, stream);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void gelu_backward(A* dinp, const A* inp, const A* dout, int64_t n, cudaStream_t stream) {
  launch_elementwise(dinp, inp, dout, n, GeluBackward{}, stream);
  CUDA_CHECK_LAUNCH();
}

template void gelu_forward<float>(float*, const float*, int64_t, cudaStream_t);
template void gelu_forward<bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void gelu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);
template void gelu_forward<fp16>(fp16*, const fp16*, int64_t, cudaStream_t);
template void gelu_backward<fp16>(fp16*, const fp16*, const fp16*, int64_t, cudaStream_t);

}  // namespace mpiformer::cuda
