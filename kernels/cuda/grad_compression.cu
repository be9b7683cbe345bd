#include <algorithm>

#include "common/grad_compression.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/grad_compression.hpp"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = static_cast<int>(kQuantBlock);

// Element i of a compressed chunk (host/grad_compression.hpp's expand_element).
__device__ float expand_element(bool int8, const uint8_t* chunk, int64_t c, int64_t i) {
  if (!int8) return bf16_to_float(reinterpret_cast<const uint16_t*>(chunk)[i]);
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  const float scale = reinterpret_cast<const float*>(chunk)[i / kQuantBlock];
  return gc_int8_add(0.0f, reinterpret_cast<const int8_t*>(chunk + 4 * blocks)[i], scale);
}

// This thread's element i of block b of a chunk (valid: i < len) and its
// value v: compressed into `chunk`; returns what error feedback keeps.
__device__ float compress_element(bool int8, uint8_t* chunk, int64_t c, int64_t b, int64_t i,
                                  bool valid, float v, float* shared) {
  if (!int8) {
    const uint16_t q = float_to_bf16(valid ? v : 0.0f);
    if (i < c + chunk_padding(false, c)) reinterpret_cast<uint16_t*>(chunk)[i] = i < c ? q : 0;
    return v - bf16_to_float(q);
  }
  const float amax = block_max(valid ? fabsf(v) : 0.0f, shared);
  const float bad = block_max(valid && !isfinite(v) ? 1.0f : 0.0f, shared);
  const float scale = gc_scale(amax, bad == 0.0f);
  if (threadIdx.x == 0) reinterpret_cast<float*>(chunk)[b] = scale;
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  const int8_t q = gc_to_int8(valid ? v : 0.0f, scale);
  if (i < c + chunk_padding(true, c)) reinterpret_cast<int8_t*>(chunk + 4 * blocks)[i] = i < c ? q : 0;
  return gc_int8_left(v, q, scale);
}

__global__ void __launch_bounds__(kThreads)
    compress_kernel(bool int8, const float* g, float* residual, int64_t n, int64_t c,
                    int64_t bytes, int64_t blocks, uint8_t* wire) {
  __shared__ float shared[kWarp];
  const int64_t k = blockIdx.x / blocks, b = blockIdx.x % blocks;
  const int64_t at = k * c, len = std::max(int64_t{0}, std::min(c, n - at));
  const int64_t i = b * kQuantBlock + threadIdx.x;
  const bool valid = i < len;
  const float v = valid ? g[at + i] + residual[at + i] : 0.0f;
  const float left = compress_element(int8, wire + k * bytes, c, b, i, valid, v, shared);
  if (valid) residual[at + i] = left;
}

__global__ void __launch_bounds__(kThreads)
    sum_kernel(bool int8, const uint8_t* wire, int parts, int64_t c, int64_t bytes, int64_t valid_n,
               float* residual, uint8_t* out) {
  __shared__ float shared[kWarp];
  const int64_t b = blockIdx.x, i = b * kQuantBlock + threadIdx.x;
  const bool valid = i < valid_n;
  float s = 0;
  if (valid) {
    for (int j = 0; j < parts; ++j) s += expand_element(int8, wire + j * bytes, c, i);
    s = s + residual[i];
  }
  const float left = compress_element(int8, out, c, b, i, valid, s, shared);
  if (valid) residual[i] = left;
}

__global__ void __launch_bounds__(kThreads)
    expand_kernel(bool int8, const uint8_t* wire, int64_t n, int64_t c, int64_t bytes, float* out) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  out[j] = expand_element(int8, wire + (j / c) * bytes, c, j % c);
}

}  // namespace

void compress_with_feedback(bool int8, const float* g, float* residual, int64_t n, int parts,
                            uint8_t* wire, cudaStream_t stream) {
  const int64_t c = chunk_elements(n, parts);
  if (c == 0) return;
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  compress_kernel<<<static_cast<unsigned>(parts * blocks), kThreads, 0, stream>>>(
      int8, g, residual, n, c, compressed_chunk_bytes(int8, c), blocks, wire);
  CUDA_CHECK_LAUNCH();
}

void sum_compressed(bool int8, const uint8_t* wire, int parts, int64_t c, int64_t valid,
                    float* residual, uint8_t* out, cudaStream_t stream) {
  if (c == 0) return;
  const int64_t blocks = (c + kQuantBlock - 1) / kQuantBlock;
  sum_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      int8, wire, parts, c, compressed_chunk_bytes(int8, c), valid, residual, out);
  CUDA_CHECK_LAUNCH();
}

void expand_compressed(bool int8, const uint8_t* wire, int parts, int64_t n, float* out,
                       cudaStream_t stream) {
  if (n == 0) return;
  const int64_t c = chunk_elements(n, parts);
  expand_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      int8, wire, n, c, compressed_chunk_bytes(int8, c), out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mpiformer::cuda
