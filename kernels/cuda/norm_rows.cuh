// LayerNorm and RMSNorm over rows of C channels, written once: RMSNorm is
// LayerNorm without the centring (Centered false: no mean, no bias).
//  - A warp per row; a lane moves 16 bytes at a time (V = 8 bf16 or 4
//    floats: a pack) where C is a whole number of packs and every row
//    starts 16 bytes aligned, else one element (V = 1).
//  - Forward: the mean (Centered), the variance from deviations (not
//    E[x^2] - m^2, which cancels for large means), the output; the row's
//    re-reads come from L1.
//  - Backward, fused: the input gradient and the weight's (and bias's)
//    gradients in one pass over dout and the input. Each warp walks rows
//    n, n + 8R, ... (R blocks of 8 warps) keeping its lanes' columns'
//    parameter sums in registers (at most J packs a lane); the block adds
//    its warps' sums in warp order, writes them as slice blockIdx of the
//    column sums' scratch, and the column sums' finishing kernel adds the
//    slices in order: a fixed order, so the bits repeat. Rows wider than
//    J packs a lane take the input-gradient pass alone and the column
//    sums (column_sums.cuh) for the parameters.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "cuda/column_sums.cuh"
#include "cuda/device_math.cuh"
#include "cuda/elementwise.cuh"

namespace mpiformer::cuda {

constexpr int kNormWarps = 8;  // rows a block takes at once

// One warp per row: out = (x - mean) * rstd * weight + bias (Centered),
// or x * rstd * weight.
template <class A, int V, bool Centered>
__global__ void __launch_bounds__(kNormWarps * kWarp)
    norm_forward_kernel(A* out, float* mean, float* rstd, const A* inp, const A* weight,
                        const A* bias, int64_t N, int64_t C, float eps) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(kNormWarps) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (n >= N) return;
  const A* x = inp + n * C;
  float m = 0.f;
  if constexpr (Centered) {
    float s = 0.f;
    for (int64_t c = lane * V; c < C; c += kWarp * V) {
      float v[V];
      load_pack<A, V>(x + c, v);
#pragma unroll
      for (int i = 0; i < V; ++i) s += v[i];
    }
    m = warp_sum(s) / static_cast<float>(C);
  }
  float ss = 0.f;
  for (int64_t c = lane * V; c < C; c += kWarp * V) {
    float v[V];
    load_pack<A, V>(x + c, v);
#pragma unroll
    for (int i = 0; i < V; ++i) ss += (v[i] - m) * (v[i] - m);
  }
  const float r = rsqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  A* o = out + n * C;
  for (int64_t c = lane * V; c < C; c += kWarp * V) {
    float v[V], w[V], b[V];
    load_pack<A, V>(x + c, v);
    load_pack<A, V>(weight + c, w);
    if constexpr (Centered) load_pack<A, V>(bias + c, b);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = (v[i] - m) * r * w[i] + (Centered ? b[i] : 0.f);
    store_pack<A, V>(o + c, v);
  }
  if (lane == 0) {
    if constexpr (Centered) mean[n] = m;
    rstd[n] = r;
  }
}

// dinp += rstd (g w - mean(g w) - xhat mean(g w xhat)) (Centered; without
// the mean(g w) term for RMSNorm), xhat = (x - mean) rstd. With Sums, the
// parameters' column sums too (dweight: g xhat, dbias: g), as slice
// blockIdx.x of `partial` ([2][gridDim.x][C] floats); J: packs a lane.
template <class A, int V, bool Centered, bool Sums, int J>
__global__ void __launch_bounds__(kNormWarps * kWarp)
    norm_backward_kernel(A* dinp, float* partial, const A* dout, const A* inp, const A* weight,
                         const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t rows_step = static_cast<int64_t>(gridDim.x) * kNormWarps;
  float dw[Sums ? J : 1][V] = {}, db[Sums ? J : 1][V] = {};
  for (int64_t n = blockIdx.x * static_cast<int64_t>(kNormWarps) + warp; n < N; n += rows_step) {
    const A* x = inp + n * C;
    const A* g = dout + n * C;
    const float m = Centered ? mean[n] : 0.f, s = rstd[n];
    float sum_g = 0.f, sum_gx = 0.f;
    for (int64_t c = lane * V; c < C; c += kWarp * V) {
      float xv[V], gv[V], wv[V];
      load_pack<A, V>(x + c, xv);
      load_pack<A, V>(g + c, gv);
      load_pack<A, V>(weight + c, wv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float gn = gv[i] * wv[i];
        sum_g += gn;
        sum_gx += gn * (xv[i] - m) * s;
      }
    }
    sum_g = Centered ? warp_sum(sum_g) / static_cast<float>(C) : 0.f;
    sum_gx = warp_sum(sum_gx) / static_cast<float>(C);
    A* d = dinp + n * C;
    // Pack j of this lane: columns (lane + 32 j) V .. + V.
    auto pass = [&](int64_t c, int j) {
      float xv[V], gv[V], wv[V], dv[V];
      load_pack<A, V>(x + c, xv);
      load_pack<A, V>(g + c, gv);
      load_pack<A, V>(weight + c, wv);
      load_pack<A, V>(d + c, dv);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float xhat = (xv[i] - m) * s, gn = gv[i] * wv[i];
        dv[i] += s * (gn - sum_g - xhat * sum_gx);
        if constexpr (Sums) {
          dw[j][i] += gv[i] * xhat;
          db[j][i] += gv[i];
        }
      }
      store_pack<A, V>(d + c, dv);
    };
    if constexpr (Sums) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int64_t c = (lane + static_cast<int64_t>(kWarp) * j) * V;
        if (c < C) pass(c, j);
      }
    } else {
      for (int64_t c = lane * V; c < C; c += kWarp * V) pass(c, 0);
    }
  }
  if constexpr (Sums) {
    // The block's sums, warp by warp: [2][C] floats of dynamic shared memory.
    float* s0 = reinterpret_cast<float*>(dynamic_smem());
    float* s1 = s0 + C;
    for (int w = 0; w < kNormWarps; ++w) {
      if (warp == w) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int64_t c = (lane + static_cast<int64_t>(kWarp) * j) * V;
          if (c >= C) continue;
#pragma unroll
          for (int i = 0; i < V; ++i) {
            s0[c + i] = (w == 0 ? 0.f : s0[c + i]) + dw[j][i];
            s1[c + i] = (w == 0 ? 0.f : s1[c + i]) + db[j][i];
          }
        }
      }
      __syncthreads();
    }
    const int64_t R = gridDim.x, r = blockIdx.x;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      partial[r * C + c] = s0[c];
      partial[(R + r) * C + c] = s1[c];
    }
  }
}

// The packs a lane holds sums for in the fused backward.
constexpr int kNormSumPacks = 8;

template <class A, int V, bool Centered>
void launch_norm_forward(A* out, float* mean, float* rstd, const A* inp, const A* weight,
                         const A* bias, int64_t N, int64_t C, float eps, cudaStream_t stream) {
  norm_forward_kernel<A, V, Centered><<<blocks_for(N, kNormWarps), kNormWarps * kWarp, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C, eps);
}

// V: 16-byte packs where C and every row allow them.
template <class A>
bool norm_packs_fit(int64_t C, std::initializer_list<const void*> rows_at) {
  bool ok = C % Pack16<A>::kCount == 0;
  for (const void* p : rows_at) ok = ok && (p == nullptr || aligned16(p));
  return ok;
}

template <class A, bool Centered>
void norm_forward(A* out, float* mean, float* rstd, const A* inp, const A* weight, const A* bias,
                  int64_t N, int64_t C, float eps, cudaStream_t stream) {
  if (norm_packs_fit<A>(C, {out, inp, weight, bias})) {
    launch_norm_forward<A, Pack16<A>::kCount, Centered>(out, mean, rstd, inp, weight, bias, N, C,
                                                        eps, stream);
  } else {
    launch_norm_forward<A, 1, Centered>(out, mean, rstd, inp, weight, bias, N, C, eps, stream);
  }
}

// The parameter gradient's term for the column sums (rows too wide to
// fuse): g xhat, and g.
template <class A, bool Centered>
struct NormParamTerm {
  const A* dout;
  const A* inp;
  const float* mean;
  const float* rstd;
  int64_t C;
  template <int V>
  __device__ void add(int64_t n, int64_t c, float* a, float* b) const {
    float g[V], x[V];
    load_pack<A, V>(dout + n * C + c, g);
    load_pack<A, V>(inp + n * C + c, x);
    const float m = Centered ? mean[n] : 0.f, s = rstd[n];
#pragma unroll
    for (int i = 0; i < V; ++i) {
      a[i] += g[i] * (x[i] - m) * s;
      b[i] += g[i];
    }
  }
};

template <class A, int V, bool Centered>
void launch_norm_backward(A* dinp, float* dweight, float* dbias, const A* dout, const A* inp,
                          const A* weight, const float* mean, const float* rstd, int64_t N,
                          int64_t C, const DeviceScratch& scratch, cudaStream_t stream) {
  constexpr int threads = kNormWarps * kWarp;
  const int64_t packs_per_lane = (C + kWarp * V - 1) / (kWarp * V);
  const int64_t slices = std::min<int64_t>(
      {(N + kNormWarps - 1) / kNormWarps, kColumnSumTargetBlocks,
       static_cast<int64_t>(scratch.bytes / (2 * sizeof(float) * static_cast<size_t>(C)))});
  const size_t block_sums = 2 * sizeof(float) * static_cast<size_t>(C);
  if (packs_per_lane <= kNormSumPacks && slices >= 1 && block_sums <= 48 * 1024) {
    const auto R = static_cast<unsigned>(slices);
    auto* partial = static_cast<float*>(scratch.data);
    if (packs_per_lane <= kNormSumPacks / 2) {
      norm_backward_kernel<A, V, Centered, true, kNormSumPacks / 2><<<R, threads, block_sums, stream>>>(
          dinp, partial, dout, inp, weight, mean, rstd, N, C);
    } else {
      norm_backward_kernel<A, V, Centered, true, kNormSumPacks><<<R, threads, block_sums, stream>>>(
          dinp, partial, dout, inp, weight, mean, rstd, N, C);
    }
    column_sums_finish_kernel<256><<<blocks_for(C, 256), 256, 0, stream>>>(
        dweight, Centered ? dbias : nullptr, partial, static_cast<int>(R), C);
    return;
  }
  norm_backward_kernel<A, V, Centered, false, 1><<<blocks_for(N, kNormWarps), threads, 0, stream>>>(
      dinp, nullptr, dout, inp, weight, mean, rstd, N, C);
  launch_column_sums<A>(dweight, Centered ? dbias : nullptr, N, C,
                        NormParamTerm<A, Centered>{dout, inp, mean, rstd, C}, scratch, stream,
                        {dout, inp});
}

template <class A, bool Centered>
void norm_backward(A* dinp, float* dweight, float* dbias, const A* dout, const A* inp,
                   const A* weight, const float* mean, const float* rstd, int64_t N, int64_t C,
                   const DeviceScratch& scratch, cudaStream_t stream) {
  if (norm_packs_fit<A>(C, {dinp, dout, inp, weight})) {
    launch_norm_backward<A, Pack16<A>::kCount, Centered>(dinp, dweight, dbias, dout, inp, weight,
                                                         mean, rstd, N, C, scratch, stream);
  } else {
    launch_norm_backward<A, 1, Centered>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                                         scratch, stream);
  }
}

}  // namespace mpiformer::cuda
