#include <cmath>

#include "cuda/attention.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per score row

// [B,T,3,NH,hs] -> 3 x [B,NH,T,hs]
template <class A>
__global__ void split_heads_kernel(A* dst, const A* qkv, int64_t B, int64_t T, int64_t NH,
                                   int64_t hs) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t C = NH * hs, n = B * T * C;
  if (i >= 3 * n) return;
  // i indexes the destination: part, b, h, t, d.
  const int64_t part = i / n, r = i % n;
  const int64_t b = r / (NH * T * hs), h = (r / (T * hs)) % NH, t = (r / hs) % T, d = r % hs;
  dst[i] = qkv[(b * T + t) * 3 * C + part * C + h * hs + d];
}

// 3 x [B,NH,T,hs] -> [B,T,3,NH,hs] (the inverse of split_heads).
template <class A>
__global__ void merge_heads3_kernel(A* qkv, const A* src, int64_t B, int64_t T, int64_t NH,
                                    int64_t hs) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t C = NH * hs, n = B * T * C;
  if (i >= 3 * n) return;
  // i indexes the destination: b, t, part, h, d.
  const int64_t b = i / (T * 3 * C), t = (i / (3 * C)) % T, part = (i / C) % 3;
  const int64_t h = (i % C) / hs, d = i % hs;
  qkv[i] = src[part * n + ((b * NH + h) * T + t) * hs + d];
}

// [B,NH,T,hs] <-> [B,T,NH,hs]; `to_heads` picks the direction.
template <class A>
__global__ void permute_heads_kernel(A* dst, const A* src, int64_t B, int64_t T, int64_t NH,
                                     int64_t hs, bool to_heads) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t C = NH * hs;
  if (i >= B * T * C) return;
  const int64_t b = i / (T * C), t = (i / C) % T, h = (i % C) / hs, d = i % hs;
  const int64_t heads = ((b * NH + h) * T + t) * hs + d;
  if (to_heads) {
    dst[heads] = src[i];
  } else {
    dst[i] = src[heads];
  }
}

// In place on the scaled scores: causal softmax of each row in float;
// entries above the diagonal become exactly zero.
template <class A>
__global__ void causal_softmax_kernel(A* att, int64_t rows, int64_t T) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int64_t t = row % T;
  A* a = att + row * T;
  float mx = -INFINITY;
  for (int64_t j = lane; j <= t; j += kWarp) mx = fmaxf(mx, to_float(a[j]));
  mx = warp_max(mx);
  float sum = 0.f;
  for (int64_t j = lane; j <= t; j += kWarp) sum += __expf(to_float(a[j]) - mx);
  const float inv = 1.f / warp_sum(sum);
  for (int64_t j = lane; j < T; j += kWarp)
    a[j] = from_float<A>(j <= t ? __expf(to_float(a[j]) - mx) * inv : 0.f);
}

// In place on dA: dS = scale * A * (dA - rowsum(A * dA)), zero above the
// diagonal so the products that follow stay causal.
template <class A>
__global__ void causal_softmax_backward_kernel(A* datt, const A* att, int64_t rows, int64_t T,
                                               float scale) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int64_t t = row % T;
  const A* a = att + row * T;
  A* d = datt + row * T;
  float dot = 0.f;
  for (int64_t j = lane; j <= t; j += kWarp) dot += to_float(a[j]) * to_float(d[j]);
  dot = warp_sum(dot);
  for (int64_t j = lane; j < T; j += kWarp) {
    const float v = j <= t ? scale * to_float(a[j]) * (to_float(d[j]) - dot) : 0.f;
    d[j] = from_float<A>(v);
  }
}

}  // namespace

template <class A>
void attention_forward(Blas& blas, A* out, A* att, const A* qkv, const AttentionScratch<A>& s,
                       int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, n = B * T * C, BH = B * NH;
  cudaStream_t stream = blas.stream();
  split_heads_kernel<<<blocks_for(3 * n, kThreads), kThreads, 0, stream>>>(s.qkv, qkv, B, T, NH,
                                                                           hs);
  CUDA_CHECK_LAUNCH();
  const A *q = s.qkv, *k = s.qkv + n, *v = s.qkv + 2 * n;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  // Scores S = scale * Q K^T, [T,T] per (batch, head).
  blas.gemm(false, true, T, T, hs, scale, q, hs, k, hs, 0.f, att, T, static_cast<const A*>(nullptr),
            GemmBatch{BH, T * hs, T * hs, T * T});
  causal_softmax_kernel<<<blocks_for(BH * T, kRowsPerBlock), kThreads, 0, stream>>>(att, BH * T, T);
  CUDA_CHECK_LAUNCH();
  // Y = A V, [T,hs] per (batch, head), then heads back side by side.
  blas.gemm(false, false, T, hs, T, 1.f, att, T, v, hs, 0.f, s.y, hs,
            static_cast<const A*>(nullptr), GemmBatch{BH, T * T, T * hs, T * hs});
  permute_heads_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(out, s.y, B, T, NH, hs,
                                                                         false);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void attention_backward(Blas& blas, A* dqkv, A* datt, const A* dout, const A* qkv, const A* att,
                        const AttentionScratch<A>& s, int64_t B, int64_t T, int64_t C,
                        int64_t NH) {
  const int64_t hs = C / NH, n = B * T * C, BH = B * NH;
  cudaStream_t stream = blas.stream();
  // q, k, v again (the forward's copies are scratch shared by every layer).
  split_heads_kernel<<<blocks_for(3 * n, kThreads), kThreads, 0, stream>>>(s.qkv, qkv, B, T, NH,
                                                                           hs);
  CUDA_CHECK_LAUNCH();
  permute_heads_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(s.y, dout, B, T, NH, hs,
                                                                         true);
  CUDA_CHECK_LAUNCH();
  const A *q = s.qkv, *k = s.qkv + n, *v = s.qkv + 2 * n, *dy = s.y;
  A *dq = s.dqkv, *dk = s.dqkv + n, *dv = s.dqkv + 2 * n;
  const A* none = nullptr;
  blas.gemm(false, true, T, T, hs, 1.f, dy, hs, v, hs, 0.f, datt, T, none,
            GemmBatch{BH, T * hs, T * hs, T * T});  // dA = dY V^T
  blas.gemm(true, false, T, hs, T, 1.f, att, T, dy, hs, 0.f, dv, hs, none,
            GemmBatch{BH, T * T, T * hs, T * hs});  // dV = A^T dY
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  causal_softmax_backward_kernel<<<blocks_for(BH * T, kRowsPerBlock), kThreads, 0, stream>>>(
      datt, att, BH * T, T, scale);
  CUDA_CHECK_LAUNCH();
  blas.gemm(false, false, T, hs, T, 1.f, datt, T, k, hs, 0.f, dq, hs, none,
            GemmBatch{BH, T * T, T * hs, T * hs});  // dQ = dS K
  blas.gemm(true, false, T, hs, T, 1.f, datt, T, q, hs, 0.f, dk, hs, none,
            GemmBatch{BH, T * T, T * hs, T * hs});  // dK = dS^T Q
  merge_heads3_kernel<<<blocks_for(3 * n, kThreads), kThreads, 0, stream>>>(dqkv, s.dqkv, B, T,
                                                                            NH, hs);
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                               \
  template void attention_forward<A>(Blas&, A*, A*, const A*, const AttentionScratch<A>&,       \
                                     int64_t, int64_t, int64_t, int64_t);                       \
  template void attention_backward<A>(Blas&, A*, A*, const A*, const A*, const A*,              \
                                      const AttentionScratch<A>&, int64_t, int64_t, int64_t,    \
                                      int64_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)

}  // namespace mpiformer::cuda
