#include <cmath>

#include "cuda/attention.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per score row

// The permutes run one block per token (b, t): the block's threads walk
// the token's contiguous channels, so reads or writes are coalesced and the
// only divisions per element are two in 32 bits (by C and by hs; a 64-bit
// division costs several times more on a GPU). Token counts, C and hs are
// far below 2^31 for any model that fits in memory.
struct TokenIndex {
  int64_t b, t;
  __device__ TokenIndex(int64_t T) : b(blockIdx.x / T), t(blockIdx.x % T) {}
};

// [B,T,3,NH,hs] -> 3 x [B,NH,T,hs]
template <class A>
__global__ void __launch_bounds__(kThreads)
    split_heads_kernel(A* dst, const A* qkv, int64_t B, int64_t T, int NH, int hs) {
  const TokenIndex tok(T);
  const int C = NH * hs;
  const int64_t n = B * T * C;
  const A* row = qkv + static_cast<int64_t>(blockIdx.x) * 3 * C;
  for (int j = threadIdx.x; j < 3 * C; j += blockDim.x) {
    const int part = j / C, r = j - part * C, h = r / hs, d = r - h * hs;
    dst[part * n + ((tok.b * NH + h) * T + tok.t) * hs + d] = row[j];
  }
}

// 3 x [B,NH,T,hs] -> [B,T,3,NH,hs] (the inverse of split_heads).
template <class A>
__global__ void __launch_bounds__(kThreads)
    merge_heads3_kernel(A* qkv, const A* src, int64_t B, int64_t T, int NH, int hs) {
  const TokenIndex tok(T);
  const int C = NH * hs;
  const int64_t n = B * T * C;
  A* row = qkv + static_cast<int64_t>(blockIdx.x) * 3 * C;
  for (int j = threadIdx.x; j < 3 * C; j += blockDim.x) {
    const int part = j / C, r = j - part * C, h = r / hs, d = r - h * hs;
    row[j] = src[part * n + ((tok.b * NH + h) * T + tok.t) * hs + d];
  }
}

// [B,NH,T,hs] <-> [B,T,NH,hs]; `to_heads` picks the direction.
template <class A>
__global__ void __launch_bounds__(kThreads)
    permute_heads_kernel(A* dst, const A* src, int64_t T, int NH, int hs, bool to_heads) {
  const TokenIndex tok(T);
  const int C = NH * hs;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * C;
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    const int h = j / hs, d = j - h * hs;
    const int64_t heads = ((tok.b * NH + h) * T + tok.t) * hs + d;
    if (to_heads) {
      dst[heads] = src[token + j];
    } else {
      dst[token + j] = src[heads];
    }
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

// One block per token.
unsigned tokens(int64_t B, int64_t T) {
  MPIFORMER_CHECK(B * T > 0 && B * T < (int64_t{1} << 31), "attention: B*T out of range");
  return static_cast<unsigned>(B * T);
}
// A head count or head size as the permutes' 32-bit index type.
int heads(int64_t x) {
  MPIFORMER_CHECK(x > 0 && x < (int64_t{1} << 20), "attention: head count or size out of range");
  return static_cast<int>(x);
}

}  // namespace

template <class A>
void attention_forward(Blas& blas, A* out, A* att, const A* qkv, const AttentionScratch<A>& s,
                       int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH, n = B * T * C, BH = B * NH;
  cudaStream_t stream = blas.stream();
  split_heads_kernel<<<tokens(B, T), kThreads, 0, stream>>>(s.qkv, qkv, B, T, heads(NH), heads(hs));
  CUDA_CHECK_LAUNCH();
  const A *q = s.qkv, *k = s.qkv + n, *v = s.qkv + 2 * n;
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  const AttentionGemms g = attention_gemms(BH, T, hs);
  // Scores S = scale * Q K^T, [T,T] per (batch, head).
  blas.gemm(g.scores, scale, q, k, 0.f, att);
  causal_softmax_kernel<<<blocks_for(BH * T, kRowsPerBlock), kThreads, 0, stream>>>(att, BH * T, T);
  CUDA_CHECK_LAUNCH();
  // Y = A V, [T,hs] per (batch, head), then heads back side by side.
  blas.gemm(g.values, 1.f, att, v, 0.f, s.y);
  permute_heads_kernel<<<tokens(B, T), kThreads, 0, stream>>>(out, s.y, T, heads(NH), heads(hs),
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
  split_heads_kernel<<<tokens(B, T), kThreads, 0, stream>>>(s.qkv, qkv, B, T, heads(NH), heads(hs));
  CUDA_CHECK_LAUNCH();
  permute_heads_kernel<<<tokens(B, T), kThreads, 0, stream>>>(s.y, dout, T, heads(NH), heads(hs),
                                                               true);
  CUDA_CHECK_LAUNCH();
  const A *q = s.qkv, *k = s.qkv + n, *v = s.qkv + 2 * n, *dy = s.y;
  A *dq = s.dqkv, *dk = s.dqkv + n, *dv = s.dqkv + 2 * n;
  const AttentionGemms g = attention_gemms(BH, T, hs);
  blas.gemm(g.dprobs, 1.f, dy, v, 0.f, datt);   // dA = dY V^T
  blas.gemm(g.dvalues, 1.f, att, dy, 0.f, dv);  // dV = A^T dY
  const float scale = 1.f / std::sqrt(static_cast<float>(hs));
  causal_softmax_backward_kernel<<<blocks_for(BH * T, kRowsPerBlock), kThreads, 0, stream>>>(
      datt, att, BH * T, T, scale);
  CUDA_CHECK_LAUNCH();
  blas.gemm(g.dqueries, 1.f, datt, k, 0.f, dq);  // dQ = dS K
  blas.gemm(g.dkeys, 1.f, datt, q, 0.f, dk);     // dK = dS^T Q
  merge_heads3_kernel<<<tokens(B, T), kThreads, 0, stream>>>(dqkv, s.dqkv, B, T, heads(NH),
                                                              heads(hs));
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
