// Fused causal attention (attention.hpp): forward with an online softmax,
// backward in two kernels (dK and dV per key tile, dQ per query tile), all
// products of tiles through block_mma. A tile of each operand sits in
// shared memory, zero-padded past T and past the head size, so every tile
// product has the same fixed shape and T need not be a multiple of a tile.
#include <cmath>
#include <type_traits>
#if defined(__CUDACC__)
#include <mma.h>
#endif

#include "core/cuda_check.hpp"
#include "cuda/attention.hpp"
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps a block
constexpr int kMaxHeadSize = 128;

// Tiles (rows of queries, of keys) by activation type and padded head
// size: the largest that keep each kernel's static shared memory within
// 48 KiB (ForwardSmem, KeySmem, QuerySmem below), in multiples of 16 where
// the tensor cores take them (bf16).
template <class A, int HS>
struct Tiles;
template <>
struct Tiles<bf16, 64> {
  static constexpr int kFwdRows = 64, kFwdKeys = 32, kBwdRows = 32, kBwdKeys = 32;
};
template <>
struct Tiles<bf16, 128> {
  static constexpr int kFwdRows = 32, kFwdKeys = 32, kBwdRows = 16, kBwdKeys = 16;
};
template <int HS>
struct Tiles<fp16, HS> : Tiles<bf16, HS> {};  // the same size
template <>
struct Tiles<float, 64> {
  static constexpr int kFwdRows = 32, kFwdKeys = 32, kBwdRows = 16, kBwdKeys = 16;
};
template <>
struct Tiles<float, 128> {
  static constexpr int kFwdRows = 16, kFwdKeys = 16, kBwdRows = 8, kBwdKeys = 16;
};

// C[M x N] += op(A)[M x K] op(B)[K x N], all in shared memory, by the
// whole block (the caller synchronises around it). C is float, row-major
// (ldc); op(A)(i, k) = A[i * lda + k] if ARow, else A[k * lda + i] (A read
// transposed); op(B)(k, j) = B[k * ldb + j] if BRow, else B[j * ldb + k].
// Here in float FMAs, one element of C a thread at a time, in k order.
template <class T, bool ARow, bool BRow, int M, int N, int K>
__device__ void fma_mma(float* C, int ldc, const T* A, int lda, const T* B, int ldb) {
  for (int e = threadIdx.x; e < M * N; e += blockDim.x) {
    const int i = e / N, j = e % N;
    float s = 0.f;
    for (int k = 0; k < K; ++k)
      s += to_float(ARow ? A[i * lda + k] : A[k * lda + i]) *
           to_float(BRow ? B[k * ldb + j] : B[j * ldb + k]);
    C[i * ldc + j] += s;
  }
}

// The same through the tensor cores where they take it (bf16 and fp16 on
// sm_80+, 16 x 16 x 16 tiles: each warp takes tiles of C, 16-bit in, float
// accumulate), else fma_mma.
template <class T, bool ARow, bool BRow, int M, int N, int K>
__device__ void block_mma(float* C, int ldc, const T* A, int lda, const T* B, int ldb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr ((std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) && M % 16 == 0 &&
                N % 16 == 0 && K % 16 == 0) {
    namespace wmma = nvcuda::wmma;
    using LA = std::conditional_t<ARow, wmma::row_major, wmma::col_major>;
    using LB = std::conditional_t<BRow, wmma::row_major, wmma::col_major>;
    const int warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
    for (int tile = warp; tile < (M / 16) * (N / 16); tile += warps) {
      const int i0 = tile / (N / 16) * 16, j0 = tile % (N / 16) * 16;
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
      wmma::load_matrix_sync(c, C + i0 * ldc + j0, ldc, wmma::mem_row_major);
      for (int k0 = 0; k0 < K; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
        wmma::load_matrix_sync(a, ARow ? A + i0 * lda + k0 : A + k0 * lda + i0, lda);
        wmma::load_matrix_sync(b, BRow ? B + k0 * ldb + j0 : B + j0 * ldb + k0, ldb);
        wmma::mma_sync(c, a, b, c);
      }
      wmma::store_matrix_sync(C + i0 * ldc + j0, c, ldc, wmma::mem_row_major);
    }
  } else {
    fma_mma<T, ARow, BRow, M, N, K>(C, ldc, A, lda, B, ldb);
  }
#else
  fma_mma<T, ARow, BRow, M, N, K>(C, ldc, A, lda, B, ldb);
#endif
}

// Rows [r0, r0 + R) of one head's [T, hs] slice (rows `stride` apart from
// `head`) into dst [R][HS]; zeros past T and past hs.
template <class A, int R, int HS>
__device__ void load_tile(A* dst, const A* head, int64_t stride, int r0, int T, int hs) {
  for (int e = threadIdx.x; e < R * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS, t = r0 + r;
    dst[e] = t < T && d < hs ? head[t * stride + d] : from_float<A>(0.f);
  }
}

// The float tile src [R][HS] (times `scale`, or over `divisor[r]`) into
// rows [r0, r0 + R) of one head's slice; rows past T and columns past hs
// are not written.
template <class A, int R, int HS>
__device__ void store_tile(A* head, int64_t stride, const float* src, const float* divisor,
                           int r0, int T, int hs) {
  for (int e = threadIdx.x; e < R * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS, t = r0 + r;
    if (t < T && d < hs)
      head[t * stride + d] = from_float<A>(divisor ? src[e] / divisor[r] : src[e]);
  }
}

__device__ void zero(float* x, int n) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) x[e] = 0.f;
}

// ---- forward ----------------------------------------------------------------

template <class A, int HS, int BR, int BC>
struct alignas(32) ForwardSmem {
  A q[BR * HS], k[BC * HS], v[BC * HS];
  A p[BR * BC];      // the tile's probabilities (unnormalised), the PV product's input
  float s[BR * BC];  // the tile's scores
  float o[BR * HS];  // the running output, unnormalised
  float m[BR], l[BR];  // the running row maximum and sum
};

// Where a head's rows start in qkv [B, T, C + 2K]: query head h of batch
// b, and the key (value) rows of its kv head h / g.
struct Heads {
  int T, C, K, NH, g, hs;
  __device__ int64_t stride() const { return static_cast<int64_t>(C) + 2 * K; }
  __device__ int64_t query(int b, int h) const {
    return static_cast<int64_t>(b) * T * stride() + static_cast<int64_t>(h) * hs;
  }
  __device__ int64_t key(int b, int kvh) const {
    return static_cast<int64_t>(b) * T * stride() + C + static_cast<int64_t>(kvh) * hs;
  }
  __device__ int64_t value(int b, int kvh) const { return key(b, kvh) + K; }
};

// One block per tile of BR query rows of one (batch, head).
template <class A, int HS, int BR, int BC>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(A* out, float* lse, const A* qkv, Heads hd, float scale) {
  __shared__ ForwardSmem<A, HS, BR, BC> sm;
  const int T = hd.T, C = hd.C, NH = hd.NH, hs = hd.hs;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, q0 = blockIdx.x * BR;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  const int64_t stride = hd.stride();
  const A* head = qkv + hd.query(b, h);
  const A* keys_at = qkv + hd.key(b, h / hd.g);
  const A* values_at = qkv + hd.value(b, h / hd.g);
  load_tile<A, BR, HS>(sm.q, head, stride, q0, T, hs);
  zero(sm.o, BR * HS);
  for (int r = threadIdx.x; r < BR; r += blockDim.x) {
    sm.m[r] = -INFINITY;
    sm.l[r] = 0.f;
  }
  // Keys up to the tile's last query (causal); the first key tile holds
  // key 0, so every real row's maximum is finite from then on.
  const int keys = q0 + BR < T ? q0 + BR : T;
  for (int k0 = 0; k0 < keys; k0 += BC) {
    __syncthreads();  // the last tile's products are done with k, v and p
    load_tile<A, BC, HS>(sm.k, keys_at, stride, k0, T, hs);
    load_tile<A, BC, HS>(sm.v, values_at, stride, k0, T, hs);
    zero(sm.s, BR * BC);
    __syncthreads();
    block_mma<A, true, false, BR, BC, HS>(sm.s, BC, sm.q, HS, sm.k, HS);  // S = Q K^T
    __syncthreads();
    // The online softmax, a warp a row: the new maximum rescales what the
    // row has summed so far.
    for (int r = warp; r < BR; r += warps) {
      const int t = q0 + r;
      float mx = -INFINITY;
      for (int c = lane; c < BC; c += kWarp) {
        const float x = t < T && k0 + c <= t ? sm.s[r * BC + c] * scale : -INFINITY;
        sm.s[r * BC + c] = x;
        mx = fmaxf(mx, x);
      }
      mx = warp_max(mx);
      const float m_old = sm.m[r], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int c = lane; c < BC; c += kWarp) {
        const float p = m_new == -INFINITY ? 0.f : __expf(sm.s[r * BC + c] - m_new);
        sm.p[r * BC + c] = from_float<A>(p);
        sum += p;
      }
      sum = warp_sum(sum);
      const float alpha = m_new == -INFINITY ? 1.f : __expf(m_old - m_new);
      for (int d = lane; d < HS; d += kWarp) sm.o[r * HS + d] *= alpha;
      if (lane == 0) {
        sm.m[r] = m_new;
        sm.l[r] = sm.l[r] * alpha + sum;
      }
    }
    __syncthreads();
    block_mma<A, true, true, BR, HS, BC>(sm.o, HS, sm.p, BC, sm.v, HS);  // O += P V
  }
  __syncthreads();
  store_tile<A, BR, HS>(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs, C,
                        sm.o, sm.l, q0, T, hs);
  for (int r = threadIdx.x; r < BR; r += blockDim.x)
    if (q0 + r < T) lse[static_cast<int64_t>(bh) * T + q0 + r] = sm.m[r] + logf(sm.l[r]);
}

// ---- backward ---------------------------------------------------------------

// delta[b, h, t] = dot(dO, O) over the head's channels of row t: each row's
// sum over keys of P * dP, which the softmax's gradient subtracts.
template <class A>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(float* delta, const A* dout, const A* out, int T, int C, int NH,
                           int hs, int64_t rows) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;  // whole warps
  const int64_t t = row % T, bh = row / T, b = bh / NH, h = bh % NH;
  const int64_t at = (b * T + t) * C + h * hs;
  float s = 0.f;
  for (int d = lane; d < hs; d += kWarp) s += to_float(dout[at + d]) * to_float(out[at + d]);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// One tile pair's operands and what both backward kernels derive from it.
template <class A, int HS, int BR, int BC>
struct alignas(32) PairSmem {
  A q[BR * HS], dout[BR * HS], k[BC * HS], v[BC * HS];
  A p[BR * BC], ds[BR * BC];   // probabilities, and the scores' gradient
  float s[BR * BC], dp[BR * BC];
  float lse[BR], delta[BR];
};

// The query tile's rows of lse and delta (zero past T).
template <class A, int HS, int BR, int BC>
__device__ void load_row_stats(PairSmem<A, HS, BR, BC>& sm, const float* lse,
                               const float* delta, int64_t bh, int q0, int T) {
  for (int r = threadIdx.x; r < BR; r += blockDim.x) {
    const int t = q0 + r;
    sm.lse[r] = t < T ? lse[bh * T + t] : 0.f;
    sm.delta[r] = t < T ? delta[bh * T + t] : 0.f;
  }
}

// With q, dout, k, v, lse and delta loaded: P = exp(S scale - lse) (zero
// above the diagonal and past T), dP = dO V^T, dS = P (dP - delta) scale.
template <class A, int HS, int BR, int BC>
__device__ void tile_gradients(PairSmem<A, HS, BR, BC>& sm, int q0, int k0, int T, float scale) {
  zero(sm.s, BR * BC);
  zero(sm.dp, BR * BC);
  __syncthreads();
  block_mma<A, true, false, BR, BC, HS>(sm.s, BC, sm.q, HS, sm.k, HS);      // S = Q K^T
  block_mma<A, true, false, BR, BC, HS>(sm.dp, BC, sm.dout, HS, sm.v, HS);  // dP = dO V^T
  __syncthreads();
  for (int e = threadIdx.x; e < BR * BC; e += blockDim.x) {
    const int r = e / BC, c = e % BC, t = q0 + r;
    const float p = t < T && k0 + c <= t ? __expf(sm.s[e] * scale - sm.lse[r]) : 0.f;
    sm.p[e] = from_float<A>(p);
    sm.ds[e] = from_float<A>(p * (sm.dp[e] - sm.delta[r]) * scale);
  }
  __syncthreads();
}

template <class A, int HS, int BR, int BC>
struct alignas(32) KeySmem {
  PairSmem<A, HS, BR, BC> t;
  float dk[BC * HS], dv[BC * HS];
};

// One block per tile of BC keys of one (batch, kv head): dK and dV over
// the query tiles at and below the diagonal of each query head of its
// group, in head order (the sum stays in float, in one block).
template <class A, int HS, int BR, int BC>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(A* dqkv, const A* dout, const A* qkv, const float* lse,
                          const float* delta, Heads hd, float scale) {
  __shared__ KeySmem<A, HS, BR, BC> sm;
  const int T = hd.T, C = hd.C, NH = hd.NH, hs = hd.hs, NKV = NH / hd.g;
  const int bkv = blockIdx.y, b = bkv / NKV, kvh = bkv % NKV, k0 = blockIdx.x * BC;
  const int64_t stride = hd.stride();
  load_tile<A, BC, HS>(sm.t.k, qkv + hd.key(b, kvh), stride, k0, T, hs);
  load_tile<A, BC, HS>(sm.t.v, qkv + hd.value(b, kvh), stride, k0, T, hs);
  zero(sm.dk, BC * HS);
  zero(sm.dv, BC * HS);
  for (int h = kvh * hd.g; h < (kvh + 1) * hd.g; ++h) {
    const int64_t bh = static_cast<int64_t>(b) * NH + h;
    const A* head = qkv + hd.query(b, h);
    const A* dhead = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
    for (int q0 = k0 / BR * BR; q0 < T; q0 += BR) {
      __syncthreads();  // the last tile's products are done with q, dout, p and ds
      load_tile<A, BR, HS>(sm.t.q, head, stride, q0, T, hs);
      load_tile<A, BR, HS>(sm.t.dout, dhead, C, q0, T, hs);
      load_row_stats(sm.t, lse, delta, bh, q0, T);
      tile_gradients(sm.t, q0, k0, T, scale);
      block_mma<A, false, true, BC, HS, BR>(sm.dv, HS, sm.t.p, BC, sm.t.dout, HS);  // dV += P^T dO
      block_mma<A, false, true, BC, HS, BR>(sm.dk, HS, sm.t.ds, BC, sm.t.q, HS);    // dK += dS^T Q
    }
  }
  __syncthreads();
  store_tile<A, BC, HS>(dqkv + hd.key(b, kvh), stride, sm.dk, nullptr, k0, T, hs);
  store_tile<A, BC, HS>(dqkv + hd.value(b, kvh), stride, sm.dv, nullptr, k0, T, hs);
}

template <class A, int HS, int BR, int BC>
struct alignas(32) QuerySmem {
  PairSmem<A, HS, BR, BC> t;
  float dq[BR * HS];
};

// One block per tile of BR queries of one (batch, head): dQ over the key
// tiles up to the diagonal.
template <class A, int HS, int BR, int BC>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(A* dqkv, const A* dout, const A* qkv, const float* lse, const float* delta,
                        Heads hd, float scale) {
  __shared__ QuerySmem<A, HS, BR, BC> sm;
  const int T = hd.T, C = hd.C, NH = hd.NH, hs = hd.hs;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, q0 = blockIdx.x * BR;
  const int64_t stride = hd.stride();
  const int64_t head_at = hd.query(b, h);
  const A* head = qkv + head_at;
  load_tile<A, BR, HS>(sm.t.q, head, stride, q0, T, hs);
  load_tile<A, BR, HS>(sm.t.dout, dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs,
                       C, q0, T, hs);
  load_row_stats(sm.t, lse, delta, bh, q0, T);
  zero(sm.dq, BR * HS);
  const int keys = q0 + BR < T ? q0 + BR : T;
  for (int k0 = 0; k0 < keys; k0 += BC) {
    __syncthreads();  // the last tile's products are done with k, v and ds
    load_tile<A, BC, HS>(sm.t.k, qkv + hd.key(b, h / hd.g), stride, k0, T, hs);
    load_tile<A, BC, HS>(sm.t.v, qkv + hd.value(b, h / hd.g), stride, k0, T, hs);
    tile_gradients(sm.t, q0, k0, T, scale);
    block_mma<A, true, true, BR, HS, BC>(sm.dq, HS, sm.t.ds, BC, sm.t.k, HS);  // dQ += dS K
  }
  __syncthreads();
  store_tile<A, BR, HS>(dqkv + head_at, stride, sm.dq, nullptr, q0, T, hs);
}

// ---- launchers --------------------------------------------------------------

struct Shape {
  int T, C, NH, hs;
  unsigned heads;  // B * NH: the grid's y
  float scale;
  Heads hd;
  unsigned kv_heads;  // B * NKV: the key kernel's grid's y
};

Shape check_shape(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV) {
  MPIFORMER_CHECK(B > 0 && T > 0 && NH > 0 && C % NH == 0, "attention: bad shape");
  MPIFORMER_CHECK(NKV > 0 && NH % NKV == 0, "attention: kv heads do not divide the heads");
  MPIFORMER_CHECK(C / NH <= kMaxHeadSize,
                  "attention: head size " + std::to_string(C / NH) + " above " +
                      std::to_string(kMaxHeadSize) + " (the fused kernels' largest tile)");
  MPIFORMER_CHECK(B * NH <= 65535, "attention: batch x heads above 65535 (the grid's y)");
  MPIFORMER_CHECK(3 * C < (int64_t{1} << 31) && T < (int64_t{1} << 31), "attention: T or C too large");
  const int hs = static_cast<int>(C / NH);
  const Heads hd{static_cast<int>(T), static_cast<int>(C), static_cast<int>(NKV) * hs,
                 static_cast<int>(NH), static_cast<int>(NH / NKV), hs};
  return Shape{static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH), hs,
               static_cast<unsigned>(B * NH), 1.f / std::sqrt(static_cast<float>(hs)), hd,
               static_cast<unsigned>(B * NKV)};
}

template <class A, int HS>
void forward_tiled(A* out, float* lse, const A* qkv, const Shape& s, cudaStream_t stream) {
  using Tl = Tiles<A, HS>;
  const dim3 grid(blocks_for(s.T, Tl::kFwdRows), s.heads);
  attention_forward_kernel<A, HS, Tl::kFwdRows, Tl::kFwdKeys><<<grid, kThreads, 0, stream>>>(
      out, lse, qkv, s.hd, s.scale);
}

template <class A, int HS>
void backward_tiled(A* dqkv, const A* dout, const A* qkv, const float* lse, const float* delta,
                    const Shape& s, cudaStream_t stream) {
  using Tl = Tiles<A, HS>;
  attention_dkdv_kernel<A, HS, Tl::kBwdRows, Tl::kBwdKeys>
      <<<dim3(blocks_for(s.T, Tl::kBwdKeys), s.kv_heads), kThreads, 0, stream>>>(
          dqkv, dout, qkv, lse, delta, s.hd, s.scale);
  attention_dq_kernel<A, HS, Tl::kBwdRows, Tl::kBwdKeys>
      <<<dim3(blocks_for(s.T, Tl::kBwdRows), s.heads), kThreads, 0, stream>>>(
          dqkv, dout, qkv, lse, delta, s.hd, s.scale);
}

}  // namespace

template <class A>
void attention_forward(A* out, float* lse, const A* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t NKV, cudaStream_t stream) {
  const Shape s = check_shape(B, T, C, NH, NKV);
  if (s.hs <= 64) {
    forward_tiled<A, 64>(out, lse, qkv, s, stream);
  } else {
    forward_tiled<A, 128>(out, lse, qkv, s, stream);
  }
  CUDA_CHECK_LAUNCH();
}

template <class A>
void attention_backward(A* dqkv, float* delta, const A* dout, const A* qkv, const A* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int64_t NKV, cudaStream_t stream) {
  const Shape s = check_shape(B, T, C, NH, NKV);
  const int64_t rows = B * NH * T;
  attention_delta_kernel<A><<<blocks_for(rows, kThreads / kWarp), kThreads, 0, stream>>>(
      delta, dout, out, s.T, s.C, s.NH, s.hs, rows);
  CUDA_CHECK_LAUNCH();
  if (s.hs <= 64) {
    backward_tiled<A, 64>(dqkv, dout, qkv, lse, delta, s, stream);
  } else {
    backward_tiled<A, 128>(dqkv, dout, qkv, lse, delta, s, stream);
  }
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                              \
  template void attention_forward<A>(A*, float*, const A*, int64_t, int64_t, int64_t, int64_t, \
                                     int64_t, cudaStream_t);                                   \
  template void attention_backward<A>(A*, float*, const A*, const A*, const A*, const float*,  \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
