// The ring's blocks on tensor cores, for 16-bit stages (issue 49): the
// fused attention's tile scheme (attention.cu, FlashAttention-2's) on one
// (query chunk, key/value block) pair, its softmax carried in the ring's
// accumulators. The ring holds its query rows in float (ring_attention.hpp),
// but a 16-bit stage's values are its activation type's, widened: tiles
// load them back into that type exactly (the key/value blocks arrive in
// it), and the products run on warp_mma.cuh's 16 x 8 x 16 fragments with
// float accumulation. As in the fused kernel,
// the probabilities and the scores' gradients are rounded to the 16-bit
// type as the next product's operand (nothing else is rounded).
//  - Forward: a block per 64 query rows of one (sequence, head), each warp
//    16 rows; the row maxima, sums and unnormalised outputs are read from
//    the accumulators, carried through the block's key tiles in registers
//    and written back.
//  - Backward, two kernels (no block waits on another): dQ, a block per
//    query tile, over the key tiles it sees (S, dP recomputed); dK and dV,
//    a block per key tile of one kv head, over its query heads in order
//    and their query tiles that see it (S^T, dP^T, dV += P^T dO,
//    dK += dS^T Q). Each block owns the rows it adds to: every sum has one
//    order, the bits repeat from run to run.
//  - Masks by global position: a key is seen where it is at most the
//    query's position and not before its document's start. Document
//    starts never decrease along a chunk, so a query tile's first row has
//    the earliest: the forward and dQ start at its key tile, dK/dV stop at
//    the first query tile whose documents begin after the key tile.
#include <cmath>
#include <string>
#include <type_traits>

#include "common/attention_storage.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/ring_attention_tiles.hpp"
#include "cuda/warp_mma.cuh"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps, 16 rows each
constexpr int kTile = kAttentionTile;
static_assert(kTile == 16 * kThreads / kWarp, "a warp a 16-row slice of the tile");
constexpr int kPad = 8;  // elements after each shared row (ldmatrix's banks)

struct Tiles {
  int64_t B, C, NH, NKV, hs, K, ld;  // ld: a fused row's C + 2K
  int g;                             // query heads per kv head
  float scale;
};

// Rows [r0, r0 + kTile) of one head's slice (rows `stride` elements apart,
// `rows` of them; float rows holding values of S, or S) into dst in S,
// zeros past the rows and past hs.
template <class S, int HS, class From>
__device__ void load_tile(S* dst, const From* head, int64_t stride, int64_t r0, int64_t rows,
                          int64_t hs) {
  constexpr int ld = HS + kPad;
  for (int e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS;
    const int64_t t = r0 + r;
    if (t < rows && d < hs) {
      if constexpr (std::is_same_v<From, S>) dst[r * ld + d] = head[t * stride + d];
      else dst[r * ld + d] = from_float<S>(head[t * stride + d]);
    } else {
      dst[r * ld + d] = from_float<S>(0.f);
    }
  }
}

// One warp's 16 rows of `a` (rows ld apart) times the 64 rows of `b`,
// transposed: c[n] holds columns 8n .. 8n + 7.
template <class S, int HS>
__device__ void rows_by_rows(FragC (&c)[kTile / 8], const S* a, const S* b) {
  constexpr int ld = HS + kPad;
  for (int n = 0; n < kTile / 8; ++n) c[n] = FragC{};
  for (int kk = 0; kk < HS / 16; ++kk) {
    FragA<S> fa;
    load_a(fa, a + kk * 16, ld);
    for (int n = 0; n < kTile / 8; n += 2) {
      FragB<S> b0, b1;
      load_b_pair(b0, b1, b + n * 8 * ld + kk * 16, ld);
      mma(c[n], fa, b0);
      mma(c[n + 1], fa, b1);
    }
  }
}

// acc += p x rows: p, 16 rows by 64 (C tiles, rounded to S), times the 64
// rows of `rows` (rows ld apart, HS wide).
template <class S, int HS>
__device__ void probs_by_rows(FragC (&acc)[HS / 8], const FragC (&p)[kTile / 8], const S* rows) {
  constexpr int ld = HS + kPad;
  for (int kk = 0; kk < kTile / 16; ++kk) {
    const FragA<S> pa = a_from_c<S>(p[2 * kk], p[2 * kk + 1]);
    for (int n = 0; n < HS / 8; n += 2) {
      FragB<S> b0, b1;
      load_b_trans_pair(b0, b1, rows + kk * 16 * ld + n * 8, ld);
      mma(acc[n], pa, b0);
      mma(acc[n + 1], pa, b1);
    }
  }
}

// The first key (local to the block at k0) a query tile's rows may see,
// and one past the last: [lo, hi), hi <= lo when none.
struct Keys {
  int64_t lo, hi;
};
__device__ Keys tile_keys(const int64_t* starts, int64_t q0, int64_t i0, int64_t nq, int64_t k0,
                          int64_t nk) {
  const int64_t last = (i0 + kTile < nq ? i0 + kTile : nq) - 1;
  int64_t hi = q0 + last - k0 + 1;
  hi = hi < nk ? hi : nk;
  int64_t lo = starts != nullptr ? starts[i0] - k0 : 0;
  lo = lo > 0 ? lo : 0;
  return {lo, hi};
}

template <class S, int HS>
constexpr size_t forward_smem() {
  return static_cast<size_t>(3) * kTile * (HS + kPad) * sizeof(S);
}

template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    tiles_forward_kernel(Tiles a, const float* qkv, int64_t q0, int64_t nq, const S* kv,
                         int64_t k0, int64_t nk, float* m, float* l, float* o,
                         const int64_t* starts) {
  constexpr int ld = HS + kPad, NS = kTile / 8, NO = HS / 8;
  S* sq = reinterpret_cast<S*>(dynamic_smem());
  S* sk = sq + kTile * ld;
  S* sv = sk + kTile * ld;
  const int64_t bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, kvh = h / a.g;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t* st = starts != nullptr ? starts + b * nq : nullptr;
  const Keys keys = tile_keys(st, q0, i0, nq, k0, nk);
  if (keys.hi <= keys.lo) return;  // the whole block: none of its rows sees this block
  const int warp = threadIdx.x / kWarp, lane = lane_id(), g = lane / 4, qd = lane % 4;
  // This lane's rows' keys, as the block's key indices [lo, hi] (32 bits,
  // positions fit: the launch checks; hi < lo for a row past nq): fewer
  // registers than positions, which the 128-wide tile needs.
  int64_t row[2];
  bool valid[2];
  int lo[2], hi[2];
  for (int r = 0; r < 2; ++r) {
    row[r] = i0 + warp * 16 + g + 8 * r;
    valid[r] = row[r] < nq;
    const int64_t last = q0 + row[r] - k0;
    hi[r] = valid[r] ? static_cast<int>(last < nk - 1 ? last : nk - 1) : -1;
    lo[r] = st != nullptr && valid[r] ? static_cast<int>(st[row[r]] - k0 > 0 ? st[row[r]] - k0 : 0) : 0;
  }
  const S* keys_at = kv + b * nk * 2 * a.K + kvh * a.hs;
  load_tile<S, HS>(sq, qkv + b * nq * a.ld + h * a.hs, a.ld, i0, nq, a.hs);
  // The accumulators: a row's sum held by its quad's first lane.
  float mr[2], lr[2];
  FragC acc[NO];
  for (int r = 0; r < 2; ++r) {
    const int64_t at = bh * nq + row[r];
    mr[r] = valid[r] ? m[at] : -INFINITY;
    lr[r] = valid[r] && qd == 0 ? l[at] : 0.f;
  }
  for (int n = 0; n < NO; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const int64_t c = n * 8 + 2 * qd + e % 2;
      acc[n].x[e] = valid[r] && c < a.hs ? o[(b * nq + row[r]) * a.C + h * a.hs + c] : 0.f;
    }
  for (int64_t kt = keys.lo / kTile; kt * kTile < keys.hi; ++kt) {
    const int64_t j0 = kt * kTile;
    __syncthreads();  // every warp is done with the last key tile
    load_tile<S, HS>(sk, keys_at, 2 * a.K, j0, nk, a.hs);
    load_tile<S, HS>(sv, keys_at + a.K, 2 * a.K, j0, nk, a.hs);
    __syncthreads();
    FragC s[NS];
    rows_by_rows<S, HS>(s, sq + warp * 16 * ld, sk);
    online_softmax_step(s, acc, mr, lr, a.scale, [&](int n, int e) {
      const int j = static_cast<int>(j0) + n * 8 + 2 * qd + e % 2;
      return j > hi[e / 2] || j < lo[e / 2];
    });
    probs_by_rows<S, HS>(acc, s, sv);
  }
  for (int r = 0; r < 2; ++r) {
    lr[r] = quad_sum(lr[r]);
    if (valid[r] && qd == 0) {
      m[bh * nq + row[r]] = mr[r];
      l[bh * nq + row[r]] = lr[r];
    }
  }
  for (int n = 0; n < NO; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const int64_t c = n * 8 + 2 * qd + e % 2;
      if (valid[r] && c < a.hs) o[(b * nq + row[r]) * a.C + h * a.hs + c] = acc[n].x[e];
    }
}

template <class S, int HS>
constexpr size_t dq_smem() {
  return static_cast<size_t>(4) * kTile * (HS + kPad) * sizeof(S);
}

// dQ of one query tile (one sequence, one head), added into dqkv's q part.
template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    tiles_dq_kernel(Tiles a, const float* qkv, int64_t q0, int64_t nq, const S* kv, int64_t k0,
                    int64_t nk, const float* dout, const float* lse, const float* delta, float* dqkv,
                    const int64_t* starts) {
  constexpr int ld = HS + kPad, NS = kTile / 8, NO = HS / 8;
  S* sq = reinterpret_cast<S*>(dynamic_smem());
  S* sdo = sq + kTile * ld;
  S* sk = sdo + kTile * ld;
  S* sv = sk + kTile * ld;
  const int64_t bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, kvh = h / a.g;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t* st = starts != nullptr ? starts + b * nq : nullptr;
  const Keys keys = tile_keys(st, q0, i0, nq, k0, nk);
  if (keys.hi <= keys.lo) return;
  const int warp = threadIdx.x / kWarp, lane = lane_id(), g = lane / 4, qd = lane % 4;
  int64_t row[2], first[2];
  bool valid[2];
  float row_lse[2], row_delta[2];
  for (int r = 0; r < 2; ++r) {
    row[r] = i0 + warp * 16 + g + 8 * r;
    valid[r] = row[r] < nq;
    first[r] = st != nullptr && valid[r] ? st[row[r]] : 0;
    row_lse[r] = valid[r] ? lse[bh * nq + row[r]] : 0.f;
    row_delta[r] = valid[r] ? delta[bh * nq + row[r]] : 0.f;
  }
  const S* keys_at = kv + b * nk * 2 * a.K + kvh * a.hs;
  load_tile<S, HS>(sq, qkv + b * nq * a.ld + h * a.hs, a.ld, i0, nq, a.hs);
  load_tile<S, HS>(sdo, dout + b * nq * a.C + h * a.hs, a.C, i0, nq, a.hs);
  FragC dq[NO];
  for (int64_t kt = keys.lo / kTile; kt * kTile < keys.hi; ++kt) {
    const int64_t j0 = kt * kTile;
    __syncthreads();
    load_tile<S, HS>(sk, keys_at, 2 * a.K, j0, nk, a.hs);
    load_tile<S, HS>(sv, keys_at + a.K, 2 * a.K, j0, nk, a.hs);
    __syncthreads();
    FragC s[NS], dp[NS];
    rows_by_rows<S, HS>(s, sq + warp * 16 * ld, sk);
    rows_by_rows<S, HS>(dp, sdo + warp * 16 * ld, sv);
    for (int n = 0; n < NS; ++n)
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const int64_t j = j0 + n * 8 + 2 * qd + e % 2, pos = k0 + j;
        const bool seen = valid[r] && j < nk && pos <= q0 + row[r] && pos >= first[r];
        const float p = seen ? __expf(s[n].x[e] * a.scale - row_lse[r]) : 0.f;
        s[n].x[e] = p * (dp[n].x[e] - row_delta[r]);  // dS, unscaled
      }
    probs_by_rows<S, HS>(dq, s, sk);
  }
  for (int n = 0; n < NO; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const int64_t c = n * 8 + 2 * qd + e % 2;
      if (valid[r] && c < a.hs) dqkv[(b * nq + row[r]) * a.ld + h * a.hs + c] += a.scale * dq[n].x[e];
    }
}

template <class S, int HS>
constexpr size_t dkv_smem() {
  return static_cast<size_t>(4) * kTile * (HS + kPad) * sizeof(S) +
         static_cast<size_t>(kTile) * (2 * sizeof(float) + sizeof(int64_t));
}

// dK and dV of one key tile of the block (one sequence, one kv head),
// added into dkv.
template <class S, int HS>
__global__ void __launch_bounds__(kThreads)
    tiles_dkv_kernel(Tiles a, const float* qkv, int64_t q0, int64_t nq, const S* kv, int64_t k0,
                     int64_t nk, const float* dout, const float* lse, const float* delta, float* dkv,
                     const int64_t* starts) {
  constexpr int ld = HS + kPad, NS = kTile / 8, NO = HS / 8;
  S* sk = reinterpret_cast<S*>(dynamic_smem());
  S* sv = sk + kTile * ld;
  S* sq = sv + kTile * ld;
  S* sdo = sq + kTile * ld;
  auto* sstart = reinterpret_cast<int64_t*>(sdo + kTile * ld);  // after whole tiles of 16-byte rows
  auto* slse = reinterpret_cast<float*>(sstart + kTile);
  float* sdelta = slse + kTile;
  const int64_t bkv = blockIdx.y, b = bkv / a.NKV, kvh = bkv % a.NKV;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t jlast = (j0 + kTile < nk ? j0 + kTile : nk) - 1;
  const int64_t* st = starts != nullptr ? starts + b * nq : nullptr;
  // Queries before the tile's first key see none of it.
  int64_t ifirst = k0 + j0 - q0;
  ifirst = ifirst > 0 ? ifirst : 0;
  if (ifirst >= nq) return;
  const int warp = threadIdx.x / kWarp, lane = lane_id(), g = lane / 4, qd = lane % 4;
  int64_t key[2];
  for (int r = 0; r < 2; ++r) key[r] = j0 + warp * 16 + g + 8 * r;
  const S* keys_at = kv + b * nk * 2 * a.K + kvh * a.hs;
  load_tile<S, HS>(sk, keys_at, 2 * a.K, j0, nk, a.hs);
  load_tile<S, HS>(sv, keys_at + a.K, 2 * a.K, j0, nk, a.hs);
  FragC dk[NO], dv[NO];
  for (int64_t h = kvh * a.g; h < (kvh + 1) * a.g; ++h) {
    const int64_t bh = b * a.NH + h;
    for (int64_t i0 = ifirst / kTile * kTile; i0 < nq; i0 += kTile) {
      // Later tiles' documents begin later still.
      if (st != nullptr && st[i0] > k0 + jlast) break;
      __syncthreads();  // every warp is done with the last query tile
      load_tile<S, HS>(sq, qkv + b * nq * a.ld + h * a.hs, a.ld, i0, nq, a.hs);
      load_tile<S, HS>(sdo, dout + b * nq * a.C + h * a.hs, a.C, i0, nq, a.hs);
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        const int64_t i = i0 + r;
        sstart[r] = i < nq && st != nullptr ? st[i] : 0;
        slse[r] = i < nq ? lse[bh * nq + i] : 0.f;
        sdelta[r] = i < nq ? delta[bh * nq + i] : 0.f;
      }
      __syncthreads();
      FragC s[NS], dp[NS];  // S^T and dP^T: this warp's 16 keys by the tile's 64 queries
      rows_by_rows<S, HS>(s, sk + warp * 16 * ld, sq);
      rows_by_rows<S, HS>(dp, sv + warp * 16 * ld, sdo);
      for (int n = 0; n < NS; ++n)
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, c = n * 8 + 2 * qd + e % 2;
          const int64_t i = i0 + c, pos = k0 + key[r];
          const bool seen = i < nq && key[r] < nk && pos <= q0 + i && pos >= sstart[c];
          const float p = seen ? __expf(s[n].x[e] * a.scale - slse[c]) : 0.f;
          s[n].x[e] = p;
          dp[n].x[e] = p * (dp[n].x[e] - sdelta[c]);  // dS^T, unscaled
        }
      probs_by_rows<S, HS>(dv, s, sdo);
      probs_by_rows<S, HS>(dk, dp, sq);
    }
  }
  for (int n = 0; n < NO; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const int64_t c = n * 8 + 2 * qd + e % 2;
      if (key[r] < nk && c < a.hs) {
        float* at = dkv + (b * nk + key[r]) * 2 * a.K + kvh * a.hs + c;
        at[0] += a.scale * dk[n].x[e];
        at[a.K] += dv[n].x[e];
      }
    }
}

Tiles tiles_of(const AttentionShape& r) {
  const int64_t hs = r.C / r.NH;
  MPIFORMER_CHECK(hs <= 128, "ring attention: head size " + std::to_string(hs) +
                                 " above 128 (the tiles' largest)");
  MPIFORMER_CHECK(r.B * r.NH <= 65535, "ring attention: batch x heads above 65535 (the grid's y)");
  return {r.B,  r.C, r.NH, r.NKV, hs, r.NKV * hs, r.C + 2 * r.NKV * hs, static_cast<int>(r.NH / r.NKV),
          1.f / std::sqrt(static_cast<float>(hs))};
}

unsigned tiles(int64_t n) { return static_cast<unsigned>((n + kTile - 1) / kTile); }

void check_positions(int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
  MPIFORMER_CHECK(q0 + nq < (int64_t{1} << 31) && k0 + nk < (int64_t{1} << 31),
                  "ring attention: positions past 2^31");
}

template <class S, int HS>
void forward_at(const Tiles& t, const float* qkv, int64_t q0, int64_t nq, const S* kv, int64_t k0,
                int64_t nk, float* m, float* l, float* o, cudaStream_t stream, const int64_t* starts) {
  constexpr size_t smem = forward_smem<S, HS>();
  allow_shared<&tiles_forward_kernel<S, HS>>(smem);
  tiles_forward_kernel<S, HS><<<dim3(tiles(nq), static_cast<unsigned>(t.B * t.NH)), kThreads, smem,
                                stream>>>(t, qkv, q0, nq, kv, k0, nk, m, l, o, starts);
  CUDA_CHECK_LAUNCH();
}

template <class S, int HS>
void backward_at(const Tiles& t, const float* qkv, int64_t q0, int64_t nq, const S* kv, int64_t k0,
                 int64_t nk, const float* dout, const float* lse, const float* delta, float* dqkv,
                 float* dkv, cudaStream_t stream, const int64_t* starts) {
  // The two kernels write disjoint buffers (dqkv's q part, dkv).
  constexpr size_t dq = dq_smem<S, HS>(), dkv_bytes = dkv_smem<S, HS>();
  allow_shared<&tiles_dq_kernel<S, HS>>(dq);
  tiles_dq_kernel<S, HS><<<dim3(tiles(nq), static_cast<unsigned>(t.B * t.NH)), kThreads, dq, stream>>>(
      t, qkv, q0, nq, kv, k0, nk, dout, lse, delta, dqkv, starts);
  CUDA_CHECK_LAUNCH();
  allow_shared<&tiles_dkv_kernel<S, HS>>(dkv_bytes);
  tiles_dkv_kernel<S, HS><<<dim3(tiles(nk), static_cast<unsigned>(t.B * t.NKV)), kThreads, dkv_bytes,
                            stream>>>(t, qkv, q0, nq, kv, k0, nk, dout, lse, delta, dkv, starts);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class S>
void ring_tiles_forward(const AttentionShape& r, const float* qkv, int64_t q0, int64_t nq, const S* kv,
                        int64_t k0, int64_t nk, float* m, float* l, float* o, cudaStream_t stream,
                        const int64_t* starts) {
  const Tiles t = tiles_of(r);
  check_positions(q0, nq, k0, nk);
  if (t.hs <= 64) forward_at<S, 64>(t, qkv, q0, nq, kv, k0, nk, m, l, o, stream, starts);
  else forward_at<S, 128>(t, qkv, q0, nq, kv, k0, nk, m, l, o, stream, starts);
}

template <class S>
void ring_tiles_backward(const AttentionShape& r, const float* qkv, int64_t q0, int64_t nq, const S* kv,
                         int64_t k0, int64_t nk, const float* dout, const float* lse, const float* delta,
                         float* dqkv, float* dkv, cudaStream_t stream, const int64_t* starts) {
  const Tiles t = tiles_of(r);
  check_positions(q0, nq, k0, nk);
  if (t.hs <= 64)
    backward_at<S, 64>(t, qkv, q0, nq, kv, k0, nk, dout, lse, delta, dqkv, dkv, stream, starts);
  else
    backward_at<S, 128>(t, qkv, q0, nq, kv, k0, nk, dout, lse, delta, dqkv, dkv, stream, starts);
}

#define MPIFORMER_INSTANTIATE(S)                                                                   \
  template void ring_tiles_forward<S>(const AttentionShape&, const float*, int64_t, int64_t, const S*,     \
                                      int64_t, int64_t, float*, float*, float*, cudaStream_t,         \
                                      const int64_t*);                                                \
  template void ring_tiles_backward<S>(const AttentionShape&, const float*, int64_t, int64_t,              \
                                       const S*, int64_t, int64_t, const float*, const float*,        \
                                       const float*, float*, float*, cudaStream_t, const int64_t*);
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
