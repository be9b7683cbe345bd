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

// One block per row, as above.
template <class A>
__global__ void crossentropy_vp_max_kernel(float* rowmax, const A* logits, int64_t V, int64_t Vl) {
  __shared__ float shared[kWarp];
  const A* z = logits + blockIdx.x * Vl;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, to_float(z[i]));
  mx = block_max(mx, shared);
  if (threadIdx.x == 0) rowmax[blockIdx.x] = mx;
}

template <class A>
__global__ void crossentropy_vp_sums_kernel(float* stats, const A* logits, const int32_t* targets,
                                            const float* rowmax, int64_t N, int64_t V, int64_t Vl,
                                            int64_t v0) {
  __shared__ float shared[kWarp];
  const A* z = logits + blockIdx.x * Vl;
  const float mx = rowmax[blockIdx.x];
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) sum += __expf(to_float(z[i]) - mx);
  sum = block_sum(sum, shared);
  if (threadIdx.x != 0) return;
  const int64_t y = static_cast<int64_t>(targets[blockIdx.x]) - v0;
  stats[blockIdx.x] = sum;
  stats[N + blockIdx.x] = y >= 0 && y < V ? to_float(z[y]) : 0.f;
}

template <class A>
__global__ void crossentropy_vp_finish_kernel(float* losses, A* logits, const int32_t* targets,
                                              const float* rowmax, const float* stats, int64_t N,
                                              int64_t V, int64_t Vl, int64_t v0, float grad_scale,
                                              bool backward) {
  const float mx = rowmax[blockIdx.x], sum = stats[blockIdx.x];
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + mx - stats[N + blockIdx.x];
  if (!backward) return;
  A* z = logits + blockIdx.x * Vl;
  const int64_t y = static_cast<int64_t>(targets[blockIdx.x]) - v0;
  const float scale = grad_scale / sum;
  for (int64_t i = threadIdx.x; i < Vl; i += blockDim.x) {
    float g = 0.f;
    if (i < V) g = __expf(to_float(z[i]) - mx) * scale - (i == y ? grad_scale : 0.f);
    z[i] = from_float<A>(g);
  }
}

}  // namespace

template <class A>
void crossentropy_vp_max(float* rowmax, const A* logits, int64_t N, int64_t V, int64_t Vl,
                         cudaStream_t stream) {
  crossentropy_vp_max_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(rowmax, logits, V,
                                                                                Vl);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void crossentropy_vp_sums(float* stats, const A* logits, const int32_t* targets,
                          const float* rowmax, int64_t N, int64_t V, int64_t Vl, int64_t v0,
                          cudaStream_t stream) {
  crossentropy_vp_sums_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      stats, logits, targets, rowmax, N, V, Vl, v0);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void crossentropy_vp_finish(float* losses, A* logits, const int32_t* targets, const float* rowmax,
                            const float* stats, int64_t N, int64_t V, int64_t Vl, int64_t v0,
                            float grad_scale, bool backward, cudaStream_t stream) {
  crossentropy_vp_finish_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      losses, logits, targets, rowmax, stats, N, V, Vl, v0, grad_scale, backward);
  CUDA_CHECK_LAUNCH();
}

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
                                                 int64_t, float, cudaStream_t);  \
  template void crossentropy_vp_max<A>(float*, const A*, int64_t, int64_t, int64_t, cudaStream_t); \
  template void crossentropy_vp_sums<A>(float*, const A*, const int32_t*, const float*, int64_t, \
                                        int64_t, int64_t, int64_t, cudaStream_t);                \
  template void crossentropy_vp_finish<A>(float*, A*, const int32_t*, const float*, const float*, \
                                          int64_t, int64_t, int64_t, int64_t, float, bool,        \
                                          cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
