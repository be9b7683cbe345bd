// RoPE: a thread per (row, head, pair).
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/rope.hpp"

namespace mpiformer::cuda {

namespace {

template <class A>
__global__ void rope_kernel(A* qkv, const float* table, int64_t N, int64_t T, int64_t width,
                            int64_t heads, int64_t half, float sign, const int32_t* positions) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= N * heads * half) return;
  const int64_t i = e % half, h = e / half % heads, n = e / (half * heads);
  const int64_t t = positions != nullptr ? positions[n] : n % T;
  const float* cs = table + (t * half + i) * 2;
  const float c = cs[0], s = sign * cs[1];
  A* x = qkv + n * width + h * 2 * half;
  const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
  x[i] = from_float<A>(x1 * c - x2 * s);
  x[i + half] = from_float<A>(x2 * c + x1 * s);
}

}  // namespace

template <class A>
void rope_rotate(A* qkv, const float* table, int64_t N, int64_t T, int64_t C, int64_t K,
                 int64_t hs, float sign, cudaStream_t stream, const int32_t* positions) {
  const int64_t heads = (C + K) / hs, half = hs / 2, n = N * heads * half;
  if (n == 0) return;
  rope_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(qkv, table, N, T, C + 2 * K, heads, half,
                                                       sign, positions);
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                             \
  template void rope_rotate<A>(A*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                               float, cudaStream_t, const int32_t*);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
