// bfloat16 on the host, as bits: the top half of an IEEE float. Widening is
// exact; narrowing rounds to nearest even (what CUDA's __float2bfloat16
// does), NaN staying NaN. For data that crosses the host in bf16: the
// host-staged communicator's reductions and exported weights.
#pragma once
#include <cstdint>
#include <cstring>

// Callable on the device too (the compressed all-reduce's kernels share
// it, kernels/common/grad_compression.hpp).
#if defined(__CUDACC__)
#define MPIFORMER_BF16_FN __host__ __device__ __forceinline__
#else
#define MPIFORMER_BF16_FN inline
#endif

namespace mpiformer {

MPIFORMER_BF16_FN float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Branch-free (a select, not a jump), so loops of it vectorise.
MPIFORMER_BF16_FN uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

}  // namespace mpiformer
