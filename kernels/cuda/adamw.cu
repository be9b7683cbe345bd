#include <algorithm>
#include <cmath>

#include "cuda/adamw.hpp"
#include "common/adamw_math.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

namespace {

// The arithmetic is common/adamw_math.hpp's, shared with the host.
template <class A, class G>
__device__ __forceinline__ void adamw_element(float* __restrict__ p, const G* __restrict__ g,
                                              float* __restrict__ m, float* __restrict__ v,
                                              const AdamWConstants<float>& k, float wd,
                                              A* copy) {
  float pi = *p, mi = *m, vi = *v;
  mpiformer::adamw_element(pi, to_float(*g), mi, vi, k, wd);
  *m = mi;
  *v = vi;
  *p = pi;
  if (copy != nullptr) *copy = from_float<A>(pi);
}

template <class A>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, int64_t n,
                             AdamWConstants<float> k, A* copy) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) adamw_element(p + i, g + i, m + i, v + i, k, k.wd, copy != nullptr ? copy + i : nullptr);
}

// One block per chunk; each array at the chunk's own offset (AdamWChunk).
// Chunks flagged `narrow` read their gradients from g16 (A).
template <class A>
__global__ void adamw_chunks_kernel(float* __restrict__ p, const float* __restrict__ g,
                                    float* __restrict__ m, float* __restrict__ v,
                                    const AdamWChunk* chunks, AdamWConstants<float> k, A* copy,
                                    const A* __restrict__ g16) {
  const AdamWChunk c = chunks[blockIdx.x];
  const float wd = c.decay ? k.wd : 0.f;
  for (int32_t j = threadIdx.x; j < c.length; j += blockDim.x) {
    A* out = copy != nullptr ? copy + c.copy_offset + j : nullptr;
    if (c.narrow)
      adamw_element(p + c.param_offset + j, g16 + c.grad_offset + j, m + c.offset + j,
                    v + c.offset + j, k, wd, out);
    else
      adamw_element(p + c.param_offset + j, g + c.grad_offset + j, m + c.offset + j,
                    v + c.offset + j, k, wd, out);
  }
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
  adamw_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(params, grads, m, v, n, adamw_constants<float>(p),
                                                       copy);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void adamw_update_chunks(float* params, const float* grads, float* m, float* v,
                         const AdamWChunk* chunks, int64_t count, const AdamWParams& p, A* copy,
                         cudaStream_t stream, const A* grads16) {
  if (count == 0) return;
  adamw_chunks_kernel<<<static_cast<unsigned>(count), 256, 0, stream>>>(
      params, grads, m, v, chunks, adamw_constants<float>(p), copy, grads16);
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
                                         cudaStream_t, const float*);
template void adamw_update_chunks<bf16>(float*, const float*, float*, float*, const AdamWChunk*,
                                        int64_t, const AdamWParams&, bf16*, cudaStream_t,
                                        const bf16*);
template void convert<float>(float*, const float*, int64_t, cudaStream_t);
template void convert<bf16>(bf16*, const float*, int64_t, cudaStream_t);
template void adamw_update<fp16>(float*, const float*, float*, float*, int64_t,
                                 const AdamWParams&, fp16*, cudaStream_t);
template void adamw_update_chunks<fp16>(float*, const float*, float*, float*, const AdamWChunk*,
                                        int64_t, const AdamWParams&, fp16*, cudaStream_t,
                                        const fp16*);
template void convert<fp16>(fp16*, const float*, int64_t, cudaStream_t);

}  // namespace mpiformer::cuda
