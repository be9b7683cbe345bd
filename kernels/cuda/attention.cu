// Fused causal attention (attention.hpp), FlashAttention-2's scheme on
// one warp's 16-row tile products (warp_mma.cuh):
//  - Tiles of 64 query rows and 64 keys; a block of 4 warps, each warp 16
//    rows (forward: queries; backward: keys). Shared memory is dynamic,
//    each row padded by 8 elements so that ldmatrix's eight rows fall in
//    distinct banks; tiles arrive 16 bytes a thread (cp.async on sm_80+),
//    the next key (backward: query) tile loading while this one computes.
//  - Forward: scores, the online softmax and the output all stay in
//    registers; the probabilities become the P V product's operand
//    without shared memory. Query tiles start longest first.
//  - Backward: one kernel, five tile products (S, dP, dV += P^T dO,
//    dK += dS^T Q, dQ += dS K), where two kernels took seven (S and dP
//    recomputed for dQ). A block owns one key tile of one kv head: dK and
//    dV accumulate in its registers over the query tiles at and below the
//    diagonal of every query head of its group. dQ sums over key tiles,
//    that is over blocks: each block adds its part into a float buffer in
//    turn, key tile 0 first (a flag per query tile says whose turn it is),
//    so the sum has one order and the bits repeat from run to run with no
//    atomics. The last key tile's block writes dQ in the activation type.
//    Blocks walk their query tiles from the last down, so the blocks of a
//    head reach each query tile at the same point of their walk and wait
//    for one another only briefly. The turn order needs a key tile's block
//    to start no later than the next one's, which holds where blocks start
//    in grid order (every CUDA GPU to date; FlashAttention-3's
//    deterministic backward relies on it too); a wait past 2^36 cycles
//    (about half a minute) traps, so a broken order ends the job with a
//    CUDA error instead of hanging it.
//  - Causal blocks: only tiles at or below the diagonal run; only the
//    diagonal tile (and the tiles holding T) apply the mask.
//  - Documents ([data] document_mask; `positions` given): row t sees keys
//    t - positions[t] .. t. Document starts never decrease along a window,
//    so a query tile's first row has the earliest: the forward starts at
//    its key tile; the backward computes nothing for a (key, query) tile
//    pair the mask hides entirely (it still takes its turn at dQ).
#include <cmath>
#include <type_traits>

#include "common/attention_storage.hpp"
#include "core/cuda_check.hpp"
#include "cuda/attention.hpp"
#include "cuda/device_math.cuh"
#include "cuda/warp_mma.cuh"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps, 16 rows each
constexpr int kTile = kAttentionTile;
static_assert(kTile == 16 * kThreads / kWarp, "a warp a 16-row slice of the tile");
constexpr int kMaxHeadSize = 128;
constexpr int kPad = 8;  // elements after each shared row

// Where a head's rows start in qkv [B, T, C + 2K]: query head h of batch
// b, and the key (value) rows of its kv head h / g. `vec`: every row of
// qkv, out, dout and dqkv starts 16 bytes aligned and hs is a whole number
// of 16-byte pieces, so tiles move 16 bytes a thread.
struct Heads {
  int T, C, K, NH, g, hs;
  bool vec;
  __device__ int64_t stride() const { return static_cast<int64_t>(C) + 2 * K; }
  __device__ int64_t query(int b, int h) const {
    return static_cast<int64_t>(b) * T * stride() + static_cast<int64_t>(h) * hs;
  }
  __device__ int64_t key(int b, int kvh) const {
    return static_cast<int64_t>(b) * T * stride() + C + static_cast<int64_t>(kvh) * hs;
  }
  __device__ int64_t value(int b, int kvh) const { return key(b, kvh) + K; }
  __device__ int64_t output(int b, int h) const {
    return static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
  }
};

// Rows [r0, r0 + kTile) of one head's slice (rows `stride` apart) into
// dst (rows `ld` apart); zeros past T and past hs. Asynchronous where
// `vec` (async_commit / async_wait complete it), else done on return.
template <class A, int HS>
__device__ void load_rows(A* dst, int ld, const A* head, int64_t stride, int r0, int T, int hs,
                          bool vec) {
  if (vec) {
    constexpr int V = 16 / static_cast<int>(sizeof(A)), chunks = HS / V;
    for (int e = threadIdx.x; e < kTile * chunks; e += blockDim.x) {
      const int r = e / chunks, c = e % chunks * V, t = r0 + r;
      const bool valid = t < T && c < hs;
      copy16_async(dst + r * ld + c, valid ? head + t * stride + c : head, valid);
    }
  } else {
    for (int e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
      const int r = e / HS, d = e % HS, t = r0 + r;
      dst[r * ld + d] = t < T && d < hs ? head[t * stride + d] : from_float<A>(0.f);
    }
  }
}

// One warp stores 16 rows of src (rows `ld` apart in shared memory) to
// rows [r0, r0 + 16) of a head's slice; rows past T and columns past hs
// are not written.
template <class A, int HS>
__device__ void store_rows_warp(A* head, int64_t stride, const A* src, int ld, int r0, int T,
                                int hs, bool vec) {
  const int lane = lane_id();
  if (vec) {
    constexpr int V = 16 / static_cast<int>(sizeof(A)), chunks = HS / V;
    for (int e = lane; e < 16 * chunks; e += kWarp) {
      const int r = e / chunks, c = e % chunks * V, t = r0 + r;
      if (t < T && c < hs)
        *reinterpret_cast<uint4*>(head + t * stride + c) =
            *reinterpret_cast<const uint4*>(src + r * ld + c);
    }
  } else {
    for (int e = lane; e < 16 * HS; e += kWarp) {
      const int r = e / HS, d = e % HS, t = r0 + r;
      if (t < T && d < hs) head[t * stride + d] = src[r * ld + d];
    }
  }
}

// ---- forward ----------------------------------------------------------------

template <class A, int HS>
constexpr size_t forward_smem() {
  return static_cast<size_t>(5) * kTile * (HS + kPad) * sizeof(A);  // q, then k and v twice
}

// One block per tile of 64 query rows of one (batch, head).
template <class A, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(A* out, float* lse, const A* qkv, Heads hd, float scale,
                             const int32_t* positions) {
  constexpr int ld = HS + kPad, NS = kTile / 8, NO = HS / 8;
  A* sq = reinterpret_cast<A*>(dynamic_smem());
  A* sk = sq + kTile * ld;      // [2][kTile][ld]
  A* sv = sk + 2 * kTile * ld;  // [2][kTile][ld]
  const int T = hd.T, NH = hd.NH, hs = hd.hs;
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;  // the longest rows first
  const int warp = threadIdx.x / kWarp, lane = lane_id(), g = lane / 4, qd = lane % 4;
  const int row = q0 + warp * 16 + g;  // this lane's rows: row and row + 8
  const int64_t stride = hd.stride();
  const A* keys_at = qkv + hd.key(b, h / hd.g);
  const A* values_at = qkv + hd.value(b, h / hd.g);
  const int keys = q0 + kTile < T ? q0 + kTile : T;  // causal: up to the tile's last row
  const int nk = (keys + kTile - 1) / kTile;
  // Documents: this lane's rows' first keys, and the tile's first key tile.
  const int32_t* pos = positions != nullptr ? positions + static_cast<int64_t>(b) * T : nullptr;
  int first_key[2] = {0, 0};
  for (int r = 0; r < 2; ++r)
    if (pos != nullptr && row + 8 * r < T) first_key[r] = row + 8 * r - pos[row + 8 * r];
  const int kt0 = pos != nullptr ? (q0 - pos[q0]) / kTile : 0;
  load_rows<A, HS>(sq, ld, qkv + hd.query(b, h), stride, q0, T, hs, hd.vec);
  load_rows<A, HS>(sk, ld, keys_at, stride, kt0 * kTile, T, hs, hd.vec);
  load_rows<A, HS>(sv, ld, values_at, stride, kt0 * kTile, T, hs, hd.vec);
  async_commit();
  FragC o[NO];
  float m[2] = {-INFINITY, -INFINITY};  // running row maxima of the scaled scores
  float l[2] = {0.f, 0.f};              // this lane's part of the running row sums
  for (int kt = kt0; kt < nk; ++kt) {
    const int k0 = kt * kTile, buf = (kt - kt0) & 1;
    if (kt + 1 < nk) {
      // The other buffer was last read before the previous __syncthreads.
      load_rows<A, HS>(sk + (buf ^ 1) * kTile * ld, ld, keys_at, stride, k0 + kTile, T, hs, hd.vec);
      load_rows<A, HS>(sv + (buf ^ 1) * kTile * ld, ld, values_at, stride, k0 + kTile, T, hs,
                       hd.vec);
      async_commit();
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    __syncthreads();
    const A* k = sk + buf * kTile * ld;
    const A* v = sv + buf * kTile * ld;
    FragC s[NS];  // S = Q K^T: this warp's 16 rows by the tile's 64 keys
    for (int kk = 0; kk < HS / 16; ++kk) {
      FragA<A> qa;
      load_a(qa, sq + warp * 16 * ld + kk * 16, ld);
      for (int n = 0; n < NS; n += 2) {
        FragB<A> b0, b1;
        load_b_pair(b0, b1, k + n * 8 * ld + kk * 16, ld);
        mma(s[n], qa, b0);
        mma(s[n + 1], qa, b1);
      }
    }
    // Mask above the diagonal (the last tile only: keys past T lie above
    // every real row's diagonal) and before the rows' documents.
    const bool edge = kt == nk - 1;
    online_softmax_step(s, o, m, l, scale, [&](int n, int e) {
      const int r = e / 2, key = k0 + n * 8 + 2 * qd + e % 2;
      return (edge && key > row + 8 * r) || key < first_key[r];
    });
    // O += P V: the probabilities are the A operand as they lie.
    for (int kk = 0; kk < kTile / 16; ++kk) {
      const FragA<A> pa = a_from_c<A>(s[2 * kk], s[2 * kk + 1]);
      for (int n = 0; n < NO; n += 2) {
        FragB<A> b0, b1;
        load_b_trans_pair(b0, b1, v + kk * 16 * ld + n * 8, ld);
        mma(o[n], pa, b0);
        mma(o[n + 1], pa, b1);
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is loaded again
  }
  for (int r = 0; r < 2; ++r) l[r] = quad_sum(l[r]);
  // O / l through this warp's own query rows (read by this warp alone),
  // then out 16 bytes at a time.
  A* so = sq + warp * 16 * ld;
  for (int n = 0; n < NO; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      so[(g + 8 * r) * ld + n * 8 + 2 * qd + e % 2] = from_float<A>(o[n].x[e] / l[r]);
    }
  __syncwarp();
  store_rows_warp<A, HS>(out + hd.output(b, h), hd.C, so, ld, q0 + warp * 16, T, hs, hd.vec);
  if (qd == 0)
    for (int r = 0; r < 2; ++r)
      if (row + 8 * r < T) lse[static_cast<int64_t>(bh) * T + row + 8 * r] = m[r] + logf(l[r]);
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

// Waits until `turn` says `want` (thread 0 of the block; the caller
// synchronises the block after). See the header comment on the order.
__device__ void wait_turn(const unsigned* turn, unsigned want) {
#if defined(__CUDA_ARCH__)
  const long long start = clock64();
  while (load_acquire(turn) != want) {
    __nanosleep(100);
    if (clock64() - start > (1LL << 36)) __trap();
  }
#else
  // Blocks run one after another in grid order here: a turn not yet come
  // would never come.
  if (load_acquire(turn) != want) __trap();
#endif
}

// Query tiles a backward step moves through shared memory: double
// buffered in 16-bit types, single in float (its tiles are twice the
// bytes, and the largest must fit in 227 KiB).
template <class A>
constexpr int kStages = sizeof(A) == 2 ? 2 : 1;

template <class A, int HS>
constexpr size_t backward_smem() {
  return (static_cast<size_t>(2 + 2 * kStages<A>) * kTile * (HS + kPad) +
          static_cast<size_t>(kTile) * (kTile + kPad)) * sizeof(A) +
         2 * kStages<A> * kTile * sizeof(float);
}

// One block per tile of 64 keys of one (batch, kv head).
template <class A, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kernel(A* dqkv, float* dq_sum, unsigned* turns, const A* dout, const A* qkv,
                              const float* lse, const float* delta, Heads hd, float scale,
                              const int32_t* positions) {
  constexpr int ld = HS + kPad, lds = kTile + kPad, NO = HS / 8, S = kStages<A>;
  constexpr int kHalf = kTile / 2;  // queries a pass of the score products covers
  A* sk = reinterpret_cast<A*>(dynamic_smem());
  A* sv = sk + kTile * ld;
  A* sq = sv + kTile * ld;             // [S][kTile][ld]
  A* sdo = sq + S * kTile * ld;        // [S][kTile][ld]
  A* sds = sdo + S * kTile * ld;       // dS^T [kTile keys][lds]
  float* slse = reinterpret_cast<float*>(sds + kTile * lds);  // [S][kTile]
  float* sdelta = slse + S * kTile;                           // [S][kTile]
  const int T = hd.T, C = hd.C, NH = hd.NH, hs = hd.hs, NKV = NH / hd.g;
  const int bkv = blockIdx.y, b = bkv / NKV, kvh = bkv % NKV, j = blockIdx.x, k0 = j * kTile;
  const int nq = (T + kTile - 1) / kTile, walk = nq - j;  // query tiles j..nq-1 per head
  const int steps = hd.g * walk;
  const int warp = threadIdx.x / kWarp, lane = lane_id(), g = lane / 4, qd = lane % 4;
  const int key = k0 + warp * 16 + g;  // this lane's keys: key and key + 8
  const int64_t stride = hd.stride();
  // Step s: query head h, query tile i, from the last tile down.
  auto head_of = [&](int s) { return kvh * hd.g + s / walk; };
  auto tile_of = [&](int s) { return nq - 1 - s % walk; };
  auto load_step = [&](int s, int buf) {
    const int h = head_of(s), q0 = tile_of(s) * kTile;
    load_rows<A, HS>(sq + buf * kTile * ld, ld, qkv + hd.query(b, h), stride, q0, T, hs, hd.vec);
    load_rows<A, HS>(sdo + buf * kTile * ld, ld, dout + hd.output(b, h), C, q0, T, hs, hd.vec);
    const int64_t bh = static_cast<int64_t>(b) * NH + h;
    for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
      const int t = q0 + r;
      slse[buf * kTile + r] = t < T ? lse[bh * T + t] : 0.f;
      sdelta[buf * kTile + r] = t < T ? delta[bh * T + t] : 0.f;
    }
  };
  load_rows<A, HS>(sk, ld, qkv + hd.key(b, kvh), stride, k0, T, hs, hd.vec);
  load_rows<A, HS>(sv, ld, qkv + hd.value(b, kvh), stride, k0, T, hs, hd.vec);
  if (S == 2) load_step(0, 0);
  async_commit();
  FragC dk[NO], dv[NO];
  for (int step = 0; step < steps; ++step) {
    const int buf = S == 2 ? step & 1 : 0;
    if (S == 1) {
      load_step(step, 0);
      async_commit();
      async_wait<0>();
    } else if (step + 1 < steps) {
      load_step(step + 1, buf ^ 1);  // that buffer was last read before the last __syncthreads
      async_commit();
      async_wait<1>();
    } else {
      async_wait<0>();
    }
    __syncthreads();
    const int h = head_of(step), i = tile_of(step), q0 = i * kTile;
    const A* q = sq + buf * kTile * ld;
    const A* dO = sdo + buf * kTile * ld;
    const float* tl = slse + buf * kTile;
    const float* td = sdelta + buf * kTile;
    const bool edge = i == j || i == nq - 1;  // the diagonal, or rows past T
    const int32_t* pos = positions != nullptr ? positions + static_cast<int64_t>(b) * T : nullptr;
    // Every row of the query tile starts its document after this key tile.
    const bool hidden_tile = pos != nullptr && q0 - pos[q0] >= k0 + kTile;
    for (int half = 0; half < 2 && !hidden_tile; ++half) {
      const int c0 = half * kHalf;  // this pass's first query within the tile
      // S^T = K Q^T and dP^T = V dO^T: this warp's 16 keys by 32 queries.
      FragC st[kHalf / 8], dpt[kHalf / 8];
      for (int kk = 0; kk < HS / 16; ++kk) {
        FragA<A> ka, va;
        load_a(ka, sk + warp * 16 * ld + kk * 16, ld);
        load_a(va, sv + warp * 16 * ld + kk * 16, ld);
        for (int n = 0; n < kHalf / 8; n += 2) {
          FragB<A> b0, b1;
          load_b_pair(b0, b1, q + (c0 + n * 8) * ld + kk * 16, ld);
          mma(st[n], ka, b0);
          mma(st[n + 1], ka, b1);
          load_b_pair(b0, b1, dO + (c0 + n * 8) * ld + kk * 16, ld);
          mma(dpt[n], va, b0);
          mma(dpt[n + 1], va, b1);
        }
      }
      // P = exp(S scale - lse) (zero above the diagonal and past T),
      // dS = P (dP - delta) scale; dS^T also to shared memory for dQ.
      for (int n = 0; n < kHalf / 8; ++n)
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, c = c0 + n * 8 + 2 * qd + e % 2, t = q0 + c, kr = key + 8 * r;
          const bool hidden = (edge && (t < kr || t >= T)) ||  // keys past T: past every t < T
                              (pos != nullptr && t < T && kr < t - pos[t]);
          const float p = hidden ? 0.f : __expf(st[n].x[e] * scale - tl[c]);
          const float ds = p * (dpt[n].x[e] - td[c]) * scale;
          st[n].x[e] = p;
          dpt[n].x[e] = ds;
          sds[(warp * 16 + g + 8 * r) * lds + c] = from_float<A>(ds);
        }
      // dV += P^T dO, dK += dS^T Q: the probabilities and dS as they lie.
      for (int kk = 0; kk < kHalf / 16; ++kk) {
        const FragA<A> pa = a_from_c<A>(st[2 * kk], st[2 * kk + 1]);
        const FragA<A> da = a_from_c<A>(dpt[2 * kk], dpt[2 * kk + 1]);
        for (int n = 0; n < NO; n += 2) {
          FragB<A> b0, b1;
          load_b_trans_pair(b0, b1, dO + (c0 + kk * 16) * ld + n * 8, ld);
          mma(dv[n], pa, b0);
          mma(dv[n + 1], pa, b1);
          load_b_trans_pair(b0, b1, q + (c0 + kk * 16) * ld + n * 8, ld);
          mma(dk[n], da, b0);
          mma(dk[n + 1], da, b1);
        }
      }
    }
    // dQ += dS K for this query tile, in this block's turn: warp w its 16
    // query rows, 32 channels at a time. Key tile 0 writes the float sum,
    // the others add to it, the diagonal's (the last) writes dQ.
    const int64_t bh = static_cast<int64_t>(b) * NH + h;
    unsigned* turn = turns + bh * nq + i;
    if (threadIdx.x == 0) wait_turn(turn, static_cast<unsigned>(j));
    __syncthreads();
    for (int c = 0; c < NO; c += 4) {
      FragC dq[4];
      for (int kk = 0; kk < kTile / 16 && !hidden_tile; ++kk) {
        FragA<A> dsa;
        load_a_trans(dsa, sds + kk * 16 * lds + warp * 16, lds);
        for (int n = 0; n < 4; n += 2) {
          FragB<A> b0, b1;
          load_b_trans_pair(b0, b1, sk + kk * 16 * ld + (c + n) * 8, ld);
          mma(dq[n], dsa, b0);
          mma(dq[n + 1], dsa, b1);
        }
      }
      for (int n = 0; n < 4; ++n)
        for (int e = 0; e < 4; ++e) {
          const int t = q0 + warp * 16 + g + 8 * (e / 2), d = (c + n) * 8 + 2 * qd + e % 2;
          if (t >= T || d >= hs) continue;
          float* at = dq_sum + (bh * T + t) * hs + d;
          const float sum = dq[n].x[e] + (j > 0 ? load_l2(at) : 0.f);
          if (j == i) {
            dqkv[hd.query(b, h) + t * stride + d] = from_float<A>(sum);
          } else {
            store_l2(at, sum);
          }
        }
    }
    __threadfence();  // this block's part reaches L2 before the turn passes
    __syncthreads();  // and before the buffers and dS^T are reused
    if (threadIdx.x == 0) store_release(turn, static_cast<unsigned>(j + 1));
  }
  // dK and dV through this warp's own rows of the key and value tiles
  // (every warp is done with them: the loop ended on a __syncthreads).
  A* sdk = sk + warp * 16 * ld;
  A* sdv = sv + warp * 16 * ld;
  for (int n = 0; n < NO; ++n)
    for (int e = 0; e < 4; ++e) {
      const int at = (g + 8 * (e / 2)) * ld + n * 8 + 2 * qd + e % 2;
      sdk[at] = from_float<A>(dk[n].x[e]);
      sdv[at] = from_float<A>(dv[n].x[e]);
    }
  __syncwarp();
  store_rows_warp<A, HS>(dqkv + hd.key(b, kvh), stride, sdk, ld, k0 + warp * 16, T, hs, hd.vec);
  store_rows_warp<A, HS>(dqkv + hd.value(b, kvh), stride, sdv, ld, k0 + warp * 16, T, hs, hd.vec);
}

// ---- launchers --------------------------------------------------------------

struct Shape {
  int64_t B, NH, NKV;
  unsigned tiles;  // query (and key) tiles: the grids' x
  float scale;
  Heads hd;
};

Shape check_shape(int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV, size_t elem,
                  std::initializer_list<const void*> buffers) {
  MPIFORMER_CHECK(B > 0 && T > 0 && NH > 0 && C % NH == 0, "attention: bad shape");
  MPIFORMER_CHECK(NKV > 0 && NH % NKV == 0, "attention: kv heads do not divide the heads");
  MPIFORMER_CHECK(C / NH <= kMaxHeadSize,
                  "attention: head size " + std::to_string(C / NH) + " above " +
                      std::to_string(kMaxHeadSize) + " (the fused kernels' largest tile)");
  MPIFORMER_CHECK(B * NH <= 65535, "attention: batch x heads above 65535 (the grid's y)");
  MPIFORMER_CHECK(3 * C < (int64_t{1} << 31) && T < (int64_t{1} << 31), "attention: T or C too large");
  const int hs = static_cast<int>(C / NH);
  const int64_t K = NKV * hs, per16 = 16 / static_cast<int64_t>(elem);
  bool vec = hs % per16 == 0 && C % per16 == 0 && K % per16 == 0;
  for (const void* p : buffers) vec = vec && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  const Heads hd{static_cast<int>(T), static_cast<int>(C), static_cast<int>(K),
                 static_cast<int>(NH), static_cast<int>(NH / NKV), hs, vec};
  return Shape{B, NH, NKV, static_cast<unsigned>((T + kTile - 1) / kTile),
               1.f / std::sqrt(static_cast<float>(hs)), hd};
}

template <class A, int HS>
void forward_tiled(A* out, float* lse, const A* qkv, const Shape& s, cudaStream_t stream,
                   const int32_t* positions) {
  constexpr size_t smem = forward_smem<A, HS>();
  allow_shared<&attention_forward_kernel<A, HS>>(smem);
  attention_forward_kernel<A, HS><<<dim3(s.tiles, static_cast<unsigned>(s.B * s.NH)), kThreads,
                                    smem, stream>>>(out, lse, qkv, s.hd, s.scale, positions);
}

template <class A, int HS>
void backward_tiled(A* dqkv, float* dq_sum, unsigned* turns, const A* dout, const A* qkv,
                    const float* lse, const float* delta, const Shape& s, cudaStream_t stream,
                    const int32_t* positions) {
  constexpr size_t smem = backward_smem<A, HS>();
  allow_shared<&attention_backward_kernel<A, HS>>(smem);
  attention_backward_kernel<A, HS><<<dim3(s.tiles, static_cast<unsigned>(s.B * s.NKV)), kThreads,
                                     smem, stream>>>(dqkv, dq_sum, turns, dout, qkv, lse, delta,
                                                     s.hd, s.scale, positions);
}

}  // namespace

template <class A>
void attention_forward(A* out, float* lse, const A* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, int64_t NKV, cudaStream_t stream, const int32_t* positions) {
  const Shape s = check_shape(B, T, C, NH, NKV, sizeof(A), {out, qkv});
  if (s.hd.hs <= 64) {
    forward_tiled<A, 64>(out, lse, qkv, s, stream, positions);
  } else {
    forward_tiled<A, 128>(out, lse, qkv, s, stream, positions);
  }
  CUDA_CHECK_LAUNCH();
}

template <class A>
void attention_backward(A* dqkv, float* scratch, const A* dout, const A* qkv, const A* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                        int64_t NKV, cudaStream_t stream, const int32_t* positions) {
  const Shape s = check_shape(B, T, C, NH, NKV, sizeof(A), {dqkv, dout, qkv, out});
  const AttentionScratch at = attention_scratch_layout(B, NH, T, static_cast<int64_t>(s.hd.hs));
  float* delta = scratch + at.delta;
  float* dq_sum = scratch + at.dq_sum;
  auto* turns = reinterpret_cast<unsigned*>(scratch + at.turns);
  CUDA_CHECK(cudaMemsetAsync(turns, 0, static_cast<size_t>(at.turn_count) * sizeof(unsigned), stream));
  const int64_t rows = B * NH * T;
  attention_delta_kernel<A><<<blocks_for(rows, kThreads / kWarp), kThreads, 0, stream>>>(
      delta, dout, out, static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH), s.hd.hs,
      rows);
  CUDA_CHECK_LAUNCH();
  if (s.hd.hs <= 64) {
    backward_tiled<A, 64>(dqkv, dq_sum, turns, dout, qkv, lse, delta, s, stream, positions);
  } else {
    backward_tiled<A, 128>(dqkv, dq_sum, turns, dout, qkv, lse, delta, s, stream, positions);
  }
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                              \
  template void attention_forward<A>(A*, float*, const A*, int64_t, int64_t, int64_t, int64_t, \
                                     int64_t, cudaStream_t, const int32_t*);                   \
  template void attention_backward<A>(A*, float*, const A*, const A*, const A*, const float*,  \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t, \
                                      const int32_t*);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
