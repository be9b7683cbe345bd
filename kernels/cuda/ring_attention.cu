#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/context_chunks.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/ring_attention.hpp"
#include "cuda/ring_attention_tiles.hpp"

namespace mpiformer::cuda {

namespace {

// A block per warp: rows see different numbers of keys, so warps finish
// at different times and leave at once (the CPU emulation, too, wants a
// block's threads to agree on whether they shuffle at all).
constexpr int kWarps = 1, kThreads = kWarps * kWarp;
// A lane holds channels lane, lane + 32, ...: head sizes up to 128.
constexpr int kLaneChannels = 4;

struct Shape {
  int64_t B, C, NH, NKV, hs, K, ld;  // ld: a fused row's C + 2K
  __host__ __device__ int64_t group() const { return NH / NKV; }
};

Shape shape_of(const RingShape& a) {
  if (a.NH <= 0 || a.NKV <= 0 || a.NH % a.NKV != 0 || a.C % a.NH != 0)
    throw std::invalid_argument("ring attention: heads " + std::to_string(a.NH) + "/" +
                                std::to_string(a.NKV) + " do not divide C " + std::to_string(a.C));
  const int64_t hs = a.C / a.NH;
  if (hs > kWarp * kLaneChannels)
    throw std::invalid_argument("ring attention: head size " + std::to_string(hs) + " above " +
                                std::to_string(kWarp * kLaneChannels));
  return {a.B, a.C, a.NH, a.NKV, hs, a.NKV * hs, a.C + 2 * a.NKV * hs};
}

__device__ __forceinline__ int64_t lesser(int64_t x, int64_t y) { return x < y ? x : y; }
__device__ __forceinline__ int64_t greater(int64_t x, int64_t y) { return x < y ? y : x; }

// The keys [lo, hi) of a block at k0 that the query at `pos` (row `i` of
// `starts`) sees: host::visible_range.
struct Range {
  int64_t lo, hi;
};
__device__ __forceinline__ Range visible(const int64_t* starts, int64_t i, int64_t pos, int64_t k0,
                                         int64_t nk) {
  const int64_t hi = lesser(greater(pos - k0 + 1, 0), nk);
  const int64_t lo = starts == nullptr ? 0 : lesser(greater(starts[i] - k0, 0), nk);
  return {lo, greater(lo, hi)};
}

__device__ __forceinline__ float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t c = 0; c < n; ++c) s = fmaf(a[c], b[c], s);
  return s;
}

// Query row r of [B, NH, nq] (head h of sequence b, row i), the keys of
// the block at k0 it sees, its query's channels in the fused rows `qkv`,
// its kv head's first key in the block `kv` (key j at keys + j 2K, its
// value K further) and the scores' scale.
struct QueryRow {
  int64_t b, h, i;
  Range seen;
  const float* q;
  const float* keys;
  float scale;
};
__device__ __forceinline__ QueryRow query_row(const Shape& a, int64_t r, int64_t q0, int64_t nq,
                                              int64_t k0, int64_t nk, const int64_t* starts,
                                              const float* qkv, const float* kv) {
  const int64_t b = r / (a.NH * nq), h = r / nq % a.NH, i = r % nq, kvh = h / a.group();
  return {b,
          h,
          i,
          visible(starts == nullptr ? nullptr : starts + b * nq, i, q0 + i, k0, nk),
          qkv + (b * nq + i) * a.ld + h * a.hs,
          kv + b * nk * 2 * a.K + kvh * a.hs,
          rsqrtf(static_cast<float>(a.hs))};
}

// The warp's row of `rows` (-1: none; the whole warp leaves together).
__device__ __forceinline__ int64_t warp_row(int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  return r < rows ? r : -1;
}

__global__ void __launch_bounds__(kThreads)
    start_kernel(Shape a, int64_t nq, float* m, float* l, float* o) {
  const int64_t r = warp_row(a.B * a.NH * nq);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t b = r / (a.NH * nq), h = r / nq % a.NH, i = r % nq;
  if (lane == 0) {
    m[r] = -INFINITY;
    l[r] = 0.f;
  }
  float* orow = o + (b * nq + i) * a.C + h * a.hs;
  for (int64_t c = lane; c < a.hs; c += kWarp) orow[c] = 0.f;
}

// A warp per (b, h, query row): the row's keys 32 at a time, a lane's
// score each; the running maximum and sum rescaled per 32 keys.
__global__ void __launch_bounds__(kThreads)
    forward_kernel(Shape a, const float* qkv, int64_t q0, int64_t nq, const float* kv, int64_t k0,
                   int64_t nk, float* m, float* l, float* o, const int64_t* starts) {
  const int64_t r = warp_row(a.B * a.NH * nq);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const QueryRow row = query_row(a, r, q0, nq, k0, nk, starts, qkv, kv);
  const int64_t b = row.b, h = row.h, i = row.i;
  const Range seen = row.seen;
  if (seen.hi <= seen.lo) return;
  const float scale = row.scale, *q = row.q, *keys = row.keys;
  float* orow = o + (b * nq + i) * a.C + h * a.hs;
  float acc[kLaneChannels];
#pragma unroll
  for (int u = 0; u < kLaneChannels; ++u) {
    const int64_t c = lane + u * kWarp;
    acc[u] = c < a.hs ? orow[c] : 0.f;
  }
  float mi = m[r], li = l[r];
  for (int64_t j0 = seen.lo; j0 < seen.hi; j0 += kWarp) {
    const int64_t j = j0 + lane;
    const float s = j < seen.hi ? scale * dot(q, keys + j * 2 * a.K, a.hs) : -INFINITY;
    const float peak = fmaxf(mi, warp_max(s));
    // What came before, in units of the new maximum (none the first time).
    const float keep = mi == -INFINITY ? 0.f : expf(mi - peak);
    const float p = j < seen.hi ? expf(s - peak) : 0.f;
    li = li * keep + warp_sum(p);
    mi = peak;
#pragma unroll
    for (int u = 0; u < kLaneChannels; ++u) acc[u] *= keep;
    const int64_t n = lesser(kWarp, seen.hi - j0);
    for (int t = 0; t < kWarp; ++t) {
      const float pt = __shfl_sync(0xffffffffu, p, t);
      if (t >= n) continue;
      const float* v = keys + (j0 + t) * 2 * a.K + a.K;
#pragma unroll
      for (int u = 0; u < kLaneChannels; ++u) {
        const int64_t c = lane + u * kWarp;
        if (c < a.hs) acc[u] = fmaf(pt, v[c], acc[u]);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kLaneChannels; ++u) {
    const int64_t c = lane + u * kWarp;
    if (c < a.hs) orow[c] = acc[u];
  }
  if (lane == 0) {
    m[r] = mi;
    l[r] = li;
  }
}

__global__ void __launch_bounds__(kThreads)
    finish_kernel(Shape a, int64_t nq, float* o, const float* m, const float* l, float* lse) {
  const int64_t r = warp_row(a.B * a.NH * nq);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t b = r / (a.NH * nq), h = r / nq % a.NH, i = r % nq;
  const float inv = 1.f / l[r];
  float* orow = o + (b * nq + i) * a.C + h * a.hs;
  for (int64_t c = lane; c < a.hs; c += kWarp) orow[c] *= inv;
  if (lane == 0) lse[r] = m[r] + logf(l[r]);
}

__global__ void __launch_bounds__(kThreads)
    delta_kernel(Shape a, int64_t nq, const float* out, const float* dout, float* delta) {
  const int64_t r = warp_row(a.B * a.NH * nq);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t b = r / (a.NH * nq), h = r / nq % a.NH, i = r % nq;
  const int64_t at = (b * nq + i) * a.C + h * a.hs;
  float s = 0.f;
  for (int64_t c = lane; c < a.hs; c += kWarp) s = fmaf(dout[at + c], out[at + c], s);
  s = warp_sum(s);
  if (lane == 0) delta[r] = s;
}

// dS of query row i (head h) against key row j, with P: the backward's
// recomputed probability and its score gradient.
struct Grad {
  float p, ds;
};
__device__ __forceinline__ Grad score_grad(const Shape& a, float scale, const float* q,
                                           const float* k, const float* v, const float* dout,
                                           float lse, float delta) {
  const float p = expf(scale * dot(q, k, a.hs) - lse);
  return {p, scale * p * (dot(dout, v, a.hs) - delta)};
}

// dQ: a warp per (b, h, query row), its keys 32 at a time.
__global__ void __launch_bounds__(kThreads)
    dq_kernel(Shape a, const float* qkv, int64_t q0, int64_t nq, const float* kv, int64_t k0,
              int64_t nk, const float* dout, const float* lse, const float* delta, float* dqkv,
              const int64_t* starts) {
  const int64_t r = warp_row(a.B * a.NH * nq);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const QueryRow row = query_row(a, r, q0, nq, k0, nk, starts, qkv, kv);
  const int64_t b = row.b, h = row.h, i = row.i;
  const Range seen = row.seen;
  if (seen.hi <= seen.lo) return;
  const float scale = row.scale, *q = row.q, *keys = row.keys;
  const float* d = dout + (b * nq + i) * a.C + h * a.hs;
  float acc[kLaneChannels] = {};
  for (int64_t j0 = seen.lo; j0 < seen.hi; j0 += kWarp) {
    const int64_t j = j0 + lane;
    const float ds = j < seen.hi ? score_grad(a, scale, q, keys + j * 2 * a.K, keys + j * 2 * a.K + a.K,
                                              d, lse[r], delta[r]).ds
                                 : 0.f;
    const int64_t n = lesser(kWarp, seen.hi - j0);
    for (int t = 0; t < kWarp; ++t) {
      const float dst = __shfl_sync(0xffffffffu, ds, t);
      if (t >= n) continue;
      const float* k = keys + (j0 + t) * 2 * a.K;
#pragma unroll
      for (int u = 0; u < kLaneChannels; ++u) {
        const int64_t c = lane + u * kWarp;
        if (c < a.hs) acc[u] = fmaf(dst, k[c], acc[u]);
      }
    }
  }
  float* dq = dqkv + (b * nq + i) * a.ld + h * a.hs;
#pragma unroll
  for (int u = 0; u < kLaneChannels; ++u) {
    const int64_t c = lane + u * kWarp;
    if (c < a.hs) dq[c] += acc[u];
  }
}

// dK and dV: a warp per (b, kv head, key row), over the kv head's query
// heads in order and, for each, the query rows that see the key 32 at a
// time.
__global__ void __launch_bounds__(kThreads)
    dkv_kernel(Shape a, const float* qkv, int64_t q0, int64_t nq, const float* kv, int64_t k0,
               int64_t nk, const float* dout, const float* lse, const float* delta, float* dkv,
               const int64_t* starts) {
  const int64_t r = warp_row(a.B * a.NKV * nk);
  if (r < 0) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t b = r / (a.NKV * nk), kvh = r / nk % a.NKV, j = r % nk;
  // Queries before the key's position never see it.
  const int64_t first = greater(k0 + j - q0, 0);
  if (first >= nq) return;
  const float scale = rsqrtf(static_cast<float>(a.hs));
  const float* k = kv + (b * nk + j) * 2 * a.K + kvh * a.hs;
  const float* v = k + a.K;
  const int64_t* rows_start = starts == nullptr ? nullptr : starts + b * nq;
  float dk[kLaneChannels] = {}, dv[kLaneChannels] = {};
  for (int64_t h = kvh * a.group(); h < (kvh + 1) * a.group(); ++h) {
    const int64_t row0 = (b * a.NH + h) * nq;
    for (int64_t i0 = first; i0 < nq; i0 += kWarp) {
      const int64_t i = i0 + lane;
      // Row i sees key j where j lies in its visible range.
      bool sees = i < nq;
      if (sees) {
        const Range seen = visible(rows_start, i, q0 + i, k0, nk);
        sees = seen.lo <= j && j < seen.hi;
      }
      Grad g{0.f, 0.f};
      if (sees)
        g = score_grad(a, scale, qkv + (b * nq + i) * a.ld + h * a.hs, k, v,
                       dout + (b * nq + i) * a.C + h * a.hs, lse[row0 + i], delta[row0 + i]);
      const int64_t n = lesser(kWarp, nq - i0);
      for (int t = 0; t < kWarp; ++t) {
        const float pt = __shfl_sync(0xffffffffu, g.p, t);
        const float dst = __shfl_sync(0xffffffffu, g.ds, t);
        if (t >= n) continue;
        const float* q = qkv + (b * nq + i0 + t) * a.ld + h * a.hs;
        const float* d = dout + (b * nq + i0 + t) * a.C + h * a.hs;
#pragma unroll
        for (int u = 0; u < kLaneChannels; ++u) {
          const int64_t c = lane + u * kWarp;
          if (c < a.hs) {
            dv[u] = fmaf(pt, d[c], dv[u]);
            dk[u] = fmaf(dst, q[c], dk[u]);
          }
        }
      }
    }
  }
  float* dkr = dkv + (b * nk + j) * 2 * a.K + kvh * a.hs;
#pragma unroll
  for (int u = 0; u < kLaneChannels; ++u) {
    const int64_t c = lane + u * kWarp;
    if (c < a.hs) {
      dkr[c] += dk[u];
      dkr[a.K + c] += dv[u];
    }
  }
}

template <class U>
__global__ void copy_rows_kernel(U* dst, int64_t ldd, const U* src, int64_t lds, int64_t rows,
                                 int64_t width) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * width) return;
  dst[i / width * ldd + i % width] = src[i / width * lds + i % width];
}

__global__ void document_starts_kernel(int64_t* starts, const int32_t* positions, int64_t B,
                                       int64_t n, int64_t first, int64_t second) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= 2 * B * n) return;
  starts[row] = context_document_start(row, B, n, first, second, positions[row]);
}

// Whether any query of [q0, q0 + nq) can see any key of [k0, k0 + nk)
// under the causal mask (host::block_visible): a pair above the diagonal
// launches nothing.
bool block_visible(int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  return nq > 0 && nk > 0 && k0 <= q0 + nq - 1;
}

}  // namespace

template <class U>
void copy_rows(U* dst, int64_t ld_dst, const U* src, int64_t ld_src, int64_t rows, int64_t width,
               cudaStream_t stream) {
  if (rows * width == 0) return;
  copy_rows_kernel<<<blocks_for(rows * width, 256), 256, 0, stream>>>(dst, ld_dst, src, ld_src, rows,
                                                                      width);
  CUDA_CHECK_LAUNCH();
}

void ring_document_starts(int64_t* starts, const int32_t* positions, int64_t B, int64_t n,
                          int64_t first, int64_t second, cudaStream_t stream) {
  if (B * n == 0) return;
  document_starts_kernel<<<blocks_for(2 * B * n, 256), 256, 0, stream>>>(starts, positions, B, n,
                                                                         first, second);
  CUDA_CHECK_LAUNCH();
}

void ring_attention_start(const RingShape& rs, int64_t nq, float* m, float* l, float* o,
                          cudaStream_t stream) {
  const Shape a = shape_of(rs);
  const int64_t rows = a.B * a.NH * nq;
  if (rows == 0) return;
  start_kernel<<<blocks_for(rows, kWarps), kThreads, 0, stream>>>(a, nq, m, l, o);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void ring_attention_forward(const RingShape& rs, const float* qkv, int64_t q0, int64_t nq,
                            const A* kv, int64_t k0, int64_t nk, float* m, float* l, float* o,
                            cudaStream_t stream, const int64_t* starts) {
  const Shape a = shape_of(rs);
  if (a.B == 0 || !block_visible(q0, nq, k0, nk)) return;
  if constexpr (!std::is_same_v<A, float>) {
    ring_tiles_forward<A>(rs, qkv, q0, nq, kv, k0, nk, m, l, o, stream, starts);
  } else {
    forward_kernel<<<blocks_for(a.B * a.NH * nq, kWarps), kThreads, 0, stream>>>(
        a, qkv, q0, nq, kv, k0, nk, m, l, o, starts);
    CUDA_CHECK_LAUNCH();
  }
}

void ring_attention_finish(const RingShape& rs, int64_t nq, float* o, const float* m, const float* l,
                           float* lse, cudaStream_t stream) {
  const Shape a = shape_of(rs);
  const int64_t rows = a.B * a.NH * nq;
  if (rows == 0) return;
  finish_kernel<<<blocks_for(rows, kWarps), kThreads, 0, stream>>>(a, nq, o, m, l, lse);
  CUDA_CHECK_LAUNCH();
}

void ring_attention_delta(const RingShape& rs, int64_t nq, const float* out, const float* dout,
                          float* delta, cudaStream_t stream) {
  const Shape a = shape_of(rs);
  const int64_t rows = a.B * a.NH * nq;
  if (rows == 0) return;
  delta_kernel<<<blocks_for(rows, kWarps), kThreads, 0, stream>>>(a, nq, out, dout, delta);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void ring_attention_backward(const RingShape& rs, const float* qkv, int64_t q0, int64_t nq,
                             const A* kv, int64_t k0, int64_t nk, const float* dout,
                             const float* lse, const float* delta, float* dqkv, float* dkv,
                             cudaStream_t stream, const int64_t* starts) {
  const Shape a = shape_of(rs);
  if (a.B == 0 || !block_visible(q0, nq, k0, nk)) return;
  if constexpr (!std::is_same_v<A, float>) {
    ring_tiles_backward<A>(rs, qkv, q0, nq, kv, k0, nk, dout, lse, delta, dqkv, dkv, stream, starts);
  } else {
    // The two kernels write disjoint buffers (dqkv's q part, dkv).
    dq_kernel<<<blocks_for(a.B * a.NH * nq, kWarps), kThreads, 0, stream>>>(
        a, qkv, q0, nq, kv, k0, nk, dout, lse, delta, dqkv, starts);
    CUDA_CHECK_LAUNCH();
    dkv_kernel<<<blocks_for(a.B * a.NKV * nk, kWarps), kThreads, 0, stream>>>(
        a, qkv, q0, nq, kv, k0, nk, dout, lse, delta, dkv, starts);
    CUDA_CHECK_LAUNCH();
  }
}

#define MPIFORMER_INSTANTIATE(A)                                                                 \
  template void ring_attention_forward<A>(const RingShape&, const float*, int64_t, int64_t,         \
                                          const A*, int64_t, int64_t, float*, float*, float*,       \
                                          cudaStream_t, const int64_t*);                            \
  template void ring_attention_backward<A>(const RingShape&, const float*, int64_t, int64_t,        \
                                           const A*, int64_t, int64_t, const float*,                \
                                           const float*, const float*, float*, float*, cudaStream_t, \
                                           const int64_t*);                                         \
  template void copy_rows<A>(A*, int64_t, const A*, int64_t, int64_t, int64_t, cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
