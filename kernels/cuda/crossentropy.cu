// Softmax cross-entropy over the padded vocabulary, a block per row: the
// log-sum-exp in one pass (each thread keeps a running maximum and the sum
// of exp below it, the online softmax's pair; the block merges the pairs
// in a fixed order), rows read 16 bytes a thread where they allow, then the
// gradient written over the logits in place. The vocabulary-parallel
// passes (a slice of the vocabulary a rank) share the row walks.
#include "cuda/crossentropy.hpp"

#include <type_traits>

#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/elementwise.cuh"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 512;

// f(i, z[i]) for i in [0, n) of a row (z a const A*), or z[i] = f(i, z[i])
// (z an A*), the block's threads sharing the row: 16-byte packs where the
// row allows (`vec`), the tail one at a time.
template <class P, class F>
__device__ void walk_row(P z, int64_t n, bool vec, F f) {
  using A = std::remove_const_t<std::remove_pointer_t<P>>;
  constexpr bool kWrite = !std::is_const_v<std::remove_pointer_t<P>>;
  constexpr int V = Pack16<A>::kCount;
  auto take = [&](int64_t i, float x) {
    if constexpr (kWrite) {
      return f(i, x);
    } else {
      f(i, x);
      return x;
    }
  };
  int64_t i0 = 0;
  if (vec) {
    const int64_t packs = n / V;
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[V];
      load_pack<A, V>(z + p * V, v);
      for (int k = 0; k < V; ++k) v[k] = take(p * V + k, v[k]);
      if constexpr (kWrite) store_pack<A, V>(z + p * V, v);
    }
    i0 = packs * V;
  }
  for (int64_t i = i0 + threadIdx.x; i < n; i += blockDim.x) {
    const float x = take(i, to_float(z[i]));
    if constexpr (kWrite) z[i] = from_float<A>(x);
  }
}

// A running maximum and the sum of exp(x - max) (the online softmax's
// pair), and the pair of two such sums.
struct MaxSum {
  float m = -INFINITY, s = 0.f;
  __device__ void take(float x) {
    if (x > m) {
      s = s * __expf(m - x) + 1.f;  // exp(-inf) = 0 for the first
      m = x;
    } else if (x > -INFINITY) {
      s += __expf(x - m);
    }
  }
  __device__ void merge(float m2, float s2) {
    const float top = fmaxf(m, m2);
    if (top == -INFINITY) return;
    s = (m == -INFINITY ? 0.f : s * __expf(m - top)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - top));
    m = top;
  }
};

// Over the block, in a fixed order (lanes by the butterfly, then warps in
// order): every thread gets the row's pair.
__device__ MaxSum block_max_sum(MaxSum v, float* shared) {
  for (int o = kWarp / 2; o > 0; o >>= 1)
    v.merge(__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o));
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  __syncthreads();  // a previous call may still be reading `shared`
  if (lane == 0) {
    shared[2 * warp] = v.m;
    shared[2 * warp + 1] = v.s;
  }
  __syncthreads();
  MaxSum w;
  if (lane < warps) w.m = shared[2 * lane], w.s = shared[2 * lane + 1];
  for (int o = kWarp / 2; o > 0; o >>= 1)
    w.merge(__shfl_xor_sync(0xffffffffu, w.m, o), __shfl_xor_sync(0xffffffffu, w.s, o));
  return w;
}

// The log-sum-exp over the row's V real columns, in one pass.
template <class A>
__device__ float row_logsumexp(const A* z, int64_t V, bool vec, float* shared) {
  MaxSum ms;
  walk_row(z, V, vec, [&](int64_t, float x) { ms.take(x); });
  ms = block_max_sum(ms, shared);
  return logf(ms.s) + ms.m;
}

template <class A>
__global__ void crossentropy_forward_kernel(float* losses, const A* logits,
                                            const int32_t* targets, int64_t V, int64_t Vp,
                                            bool vec) {
  __shared__ float shared[2 * kWarp];
  const A* z = logits + blockIdx.x * Vp;
  const float lse = row_logsumexp(z, V, vec, shared);
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - to_float(z[targets[blockIdx.x]]);
}

template <class A>
__global__ void crossentropy_forward_backward_kernel(float* losses, A* logits,
                                                     const int32_t* targets, int64_t V,
                                                     int64_t Vp, float grad_scale, bool vec) {
  __shared__ float shared[2 * kWarp];
  A* z = logits + blockIdx.x * Vp;
  const int32_t y = targets[blockIdx.x];
  // Read the target's logit before any thread overwrites the row; the
  // reduction below synchronises the block.
  const float zy = to_float(z[y]);
  const float lse = row_logsumexp(z, V, vec, shared);
  if (threadIdx.x == 0) losses[blockIdx.x] = lse - zy;
  walk_row(z, Vp, vec, [&](int64_t i, float x) {
    return i < V ? grad_scale * (__expf(x - lse) - (i == y ? 1.f : 0.f)) : 0.f;
  });
}

// One block per row, as above.
template <class A>
__global__ void crossentropy_vp_max_kernel(float* rowmax, const A* logits, int64_t V, int64_t Vl,
                                           bool vec) {
  __shared__ float shared[kWarp];
  const A* z = logits + blockIdx.x * Vl;
  float mx = -INFINITY;
  walk_row(z, V, vec, [&](int64_t, float x) { mx = fmaxf(mx, x); });
  mx = block_max(mx, shared);
  if (threadIdx.x == 0) rowmax[blockIdx.x] = mx;
}

template <class A>
__global__ void crossentropy_vp_sums_kernel(float* stats, const A* logits, const int32_t* targets,
                                            const float* rowmax, int64_t N, int64_t V, int64_t Vl,
                                            int64_t v0, bool vec) {
  __shared__ float shared[kWarp];
  const A* z = logits + blockIdx.x * Vl;
  const float mx = rowmax[blockIdx.x];
  float sum = 0.f;
  walk_row(z, V, vec, [&](int64_t, float x) { sum += __expf(x - mx); });
  sum = block_sum(sum, shared);
  if (threadIdx.x != 0) return;
  const int64_t y = static_cast<int64_t>(targets[blockIdx.x]) - v0;
  stats[blockIdx.x] = sum;
  stats[N + blockIdx.x] = y >= 0 && y < V ? to_float(z[y]) : 0.f;
}

template <class A>
__global__ void crossentropy_vp_finish_kernel(float* losses, A* logits, const int32_t* targets,
                                              const float* rowmax, const float* stats, int64_t N,
                                              int64_t V, int64_t Vl, int64_t v0, float grad_scale,
                                              bool backward, bool vec) {
  const float mx = rowmax[blockIdx.x], sum = stats[blockIdx.x];
  if (threadIdx.x == 0) losses[blockIdx.x] = logf(sum) + mx - stats[N + blockIdx.x];
  if (!backward) return;
  A* z = logits + blockIdx.x * Vl;
  const int64_t y = static_cast<int64_t>(targets[blockIdx.x]) - v0;
  const float scale = grad_scale / sum;
  walk_row(z, Vl, vec, [&](int64_t i, float x) {
    return i < V ? __expf(x - mx) * scale - (i == y ? grad_scale : 0.f) : 0.f;
  });
}

// Rows of `width` elements from `logits` start 16 bytes aligned.
template <class A>
bool rows_in_packs(const A* logits, int64_t width) {
  return aligned16(logits) && (width * static_cast<int64_t>(sizeof(A))) % 16 == 0;
}

}  // namespace

template <class A>
void crossentropy_vp_max(float* rowmax, const A* logits, int64_t N, int64_t V, int64_t Vl,
                         cudaStream_t stream) {
  crossentropy_vp_max_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      rowmax, logits, V, Vl, rows_in_packs(logits, Vl));
  CUDA_CHECK_LAUNCH();
}

template <class A>
void crossentropy_vp_sums(float* stats, const A* logits, const int32_t* targets,
                          const float* rowmax, int64_t N, int64_t V, int64_t Vl, int64_t v0,
                          cudaStream_t stream) {
  crossentropy_vp_sums_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      stats, logits, targets, rowmax, N, V, Vl, v0, rows_in_packs(logits, Vl));
  CUDA_CHECK_LAUNCH();
}

template <class A>
void crossentropy_vp_finish(float* losses, A* logits, const int32_t* targets, const float* rowmax,
                            const float* stats, int64_t N, int64_t V, int64_t Vl, int64_t v0,
                            float grad_scale, bool backward, cudaStream_t stream) {
  crossentropy_vp_finish_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      losses, logits, targets, rowmax, stats, N, V, Vl, v0, grad_scale, backward,
      rows_in_packs(logits, Vl));
  CUDA_CHECK_LAUNCH();
}

template <class A>
void crossentropy_forward(float* losses, const A* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp, cudaStream_t stream) {
  crossentropy_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      losses, logits, targets, V, Vp, rows_in_packs(logits, Vp));
  CUDA_CHECK_LAUNCH();
}

template <class A>
void crossentropy_forward_backward(float* losses, A* logits, const int32_t* targets, int64_t N,
                                   int64_t V, int64_t Vp, float grad_scale, cudaStream_t stream) {
  crossentropy_forward_backward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(
      losses, logits, targets, V, Vp, grad_scale, rows_in_packs(logits, Vp));
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                               \
  template void crossentropy_forward<A>(float*, const A*, const int32_t*, int64_t, int64_t,     \
                                        int64_t, cudaStream_t);                                 \
  template void crossentropy_forward_backward<A>(float*, A*, const int32_t*, int64_t, int64_t,  \
                                                 int64_t, float, cudaStream_t);  \
  template void crossentropy_vp_max<A>(float*, const A*, int64_t, int64_t, int64_t, cudaStream_t); \
  template void crossentropy_vp_sums<A>(float*, const A*, const int32_t*, const float*, int64_t, \
                                        int64_t, int64_t, int64_t, cudaStream_t);                \
  template void crossentropy_vp_finish<A>(float*, A*, const int32_t*, const float*, const float*, \
                                          int64_t, int64_t, int64_t, int64_t, float, bool,        \
                                          cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
