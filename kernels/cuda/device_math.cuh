// Device-side helpers shared by the kernels: conversions between the
// activation type and float (all arithmetic is float), and warp and block
// reductions in a fixed order (so repeated runs give the same bits).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/precision.hpp"

namespace mpiformer::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(fp16 x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ fp16 from_float<fp16>(float x) {
  return __float2half_rn(x);
}

constexpr int kWarp = 32;

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `shared` holds 32 values; the call may be repeated.
template <class T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// How many threads before this one in the block have `flag` set, and (in
// *total) how many in all. Every thread of the block calls it; `shared`
// holds 32 ints; the call may be repeated.
__device__ inline int block_exclusive_count(int flag, int* shared, int* total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  int inclusive = flag;
  for (int d = 1; d < kWarp; d <<= 1) {
    const int v = __shfl_sync(0xffffffffu, inclusive, lane >= d ? lane - d : lane);
    if (lane >= d) inclusive += v;
  }
  __syncthreads();  // a previous call may still be reading `shared`
  if (lane == kWarp - 1) shared[warp] = inclusive;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    before += w < warp ? shared[w] : 0;
    all += shared[w];
  }
  *total = all;
  return before + inclusive - flag;
}

// The launch's dynamic shared memory (the third launch parameter), 16
// bytes aligned. The CPU emulation gives each block a buffer of its own.
#if defined(MPIFORMER_CUDA_EMULATION)
__device__ inline unsigned char* dynamic_smem() { return ::emu::dynamic_shared(); }
#else
__device__ inline unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char mpiformer_dynamic_smem[];
  return mpiformer_dynamic_smem;
}
#endif

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace mpiformer::cuda
