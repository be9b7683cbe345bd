#include <algorithm>
#include <cmath>

#include "cuda/adamw.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

namespace {

struct AdamWConstants {
  float b1, b2, inv_c1, inv_sqrt_c2, lr, eps, wd, gs;
};

template <class A>
__device__ __forceinline__ void adamw_element(float* __restrict__ p, const float* __restrict__ g,
                                              float* __restrict__ m, float* __restrict__ v,
                                              int64_t i, const AdamWConstants& k, float wd,
                                              A* copy) {
  const float gi = g[i] * k.gs;
  const float mi = k.b1 * m[i] + (1.f - k.b1) * gi;
  const float vi = k.b2 * v[i] + (1.f - k.b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  // The same expression as the host kernel, bias corrections folded in.
  const float pi = p[i] - k.lr * (mi * k.inv_c1 / (sqrtf(vi) * k.inv_sqrt_c2 + k.eps) + wd * p[i]);
  p[i] = pi;
  if (copy != nullptr) copy[i] = from_float<A>(pi);
}

template <class A>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, int64_t n,
                             AdamWConstants k, A* copy) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) adamw_element(p, g, m, v, i, k, k.wd, copy);
}

// One block per chunk.
template <class A>
__global__ void adamw_chunks_kernel(float* __restrict__ p, const float* __restrict__ g,
                                    float* __restrict__ m, float* __restrict__ v,
                                    const AdamWChunk* chunks, AdamWConstants k, A* copy) {
  const AdamWChunk c = chunks[blockIdx.x];
  // The parameters may live apart from the rest (AdamWChunk::param_offset);
  // the copy follows the gradients' order.
  for (int32_t j = threadIdx.x; j < c.length; j += blockDim.x)
    adamw_element(p + (c.param_offset - c.offset), g, m, v, c.offset + j, k,
                  c.decay ? k.wd : 0.f, copy);
}

AdamWConstants constants(const AdamWParams& p) {
  const double c1 = 1.0 - std::pow(p.beta1, static_cast<double>(p.step));
  const double c2 = 1.0 - std::pow(p.beta2, static_cast<double>(p.step));
  return AdamWConstants{static_cast<float>(p.beta1),        static_cast<float>(p.beta2),
                        static_cast<float>(1.0 / c1),       static_cast<float>(1.0 / std::sqrt(c2)),
                        static_cast<float>(p.lr),           static_cast<float>(p.eps),
                        static_cast<float>(p.weight_decay), static_cast<float>(p.grad_scale)};
}

template <class A>
__global__ void convert_kernel(A* dst, const float* src, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = from_float<A>(src[i]);
}

}  // namespace

template <class A>
void adamw_update(float* params, const float* grads, float* m, float* v, int64_t n,
                  const AdamWParams& p, A* copy, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(params, grads, m, v, n, constants(p),
                                                       copy);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void adamw_update_chunks(float* params, const float* grads, float* m, float* v,
                         const AdamWChunk* chunks, int64_t count, const AdamWParams& p, A* copy,
                         cudaStream_t stream) {
  if (count == 0) return;
  adamw_chunks_kernel<<<static_cast<unsigned>(count), 256, 0, stream>>>(params, grads, m, v,
                                                                        chunks, constants(p), copy);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void convert(A* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  convert_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t,
                                  const AdamWParams&, float*, cudaStream_t);
template void adamw_update<bf16>(float*, const float*, float*, float*, int64_t,
                                 const AdamWParams&, bf16*, cudaStream_t);
template void adamw_update_chunks<float>(float*, const float*, float*, float*,
                                         const AdamWChunk*, int64_t, const AdamWParams&, float*,
                                         cudaStream_t);
template void adamw_update_chunks<bf16>(float*, const float*, float*, float*, const AdamWChunk*,
                                        int64_t, const AdamWParams&, bf16*, cudaStream_t);
template void convert<float>(float*, const float*, int64_t, cudaStream_t);
template void convert<bf16>(bf16*, const float*, int64_t, cudaStream_t);
template void adamw_update<fp16>(float*, const float*, float*, float*, int64_t,
                                 const AdamWParams&, fp16*, cudaStream_t);
template void adamw_update_chunks<fp16>(float*, const float*, float*, float*, const AdamWChunk*,
                                        int64_t, const AdamWParams&, fp16*, cudaStream_t);
template void convert<fp16>(fp16*, const float*, int64_t, cudaStream_t);

}  // namespace mpiformer::cuda
