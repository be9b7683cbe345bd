#include "cuda/crossentropy.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 512;

// Max and sum of exp over the row's real columns; the log-sum-exp.
template <class A>
__device__ float row_logsumexp(const A* z, int64_t V, float* shared, float* mx_out) {
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, to_float(z[i]));
  mx = block_max(mx, shared);
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += __expf(to_float(z[i]) - mx);
  sum = block_sum(sum, shared);
  *mx_out = mx;
  return logf(sum) + mx;
}

template <class A>
__global__ void crossentropy_forward_kernel(float* losses, const A* logits,
                                            const int32_t* targets, int64_t V, int64_t Vp) {
  __shared__ float shared[kWarp];
  const A* z = logits + blockIdx.x * Vp;
  float mx;
  const float lse = row_logsumexp(z, V, shared, &mx);
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - to_float(z[targets[blockIdx.x]]);
}

template <class A>
__global__ void crossentropy_forward_backward_kernel(float* losses, A* logits,
                                                     const int32_t* targets, int64_t V,
                                                     int64_t Vp, float grad_scale) {
  __shared__ float shared[kWarp];
  A* z = logits + blockIdx.x * Vp;
  const int32_t y = targets[blockIdx.x];
  // Read the target's logit before any thread overwrites the row; the
  // reductions below synchronise the block.
  const float zy = to_float(z[y]);
  float mx;
  const float lse = row_logsumexp(z, V, shared, &mx);
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - zy;
  for (int64_t i = threadIdx.x; i < Vp; i += blockDim.x) {
    float g = 0.f;
    if (i < V) g = grad_scale * (__expf(to_float(z[i]) - lse) - (i == y ? 1.f : 0.f));
    z[i] = from_float<A>(g);
  }
}

}  // namespace

template <class A>
void crossentropy_forward(float* losses, const A* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp, cudaStream_t stream) {
  crossentropy_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(losses, logits,
                                                                                 targets, V, Vp);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void crossentropy_forward_backward(float* losses, A* logits, const int32_t* targets, int64_t N,
                                   int64_t V, int64_t Vp, float grad_scale, cudaStream_t stream) {
  crossentropy_forward_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      losses, logits, targets, V, Vp, grad_scale);
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                               \
  template void crossentropy_forward<A>(float*, const A*, const int32_t*, int64_t, int64_t,     \
                                        int64_t, cudaStream_t);                                 \
  template void crossentropy_forward_backward<A>(float*, A*, const int32_t*, int64_t, int64_t,  \
                                                 int64_t, float, cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)

}  // namespace mpiformer::cuda
