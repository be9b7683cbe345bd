// Compressed gradients on the wire (train/compressed_allreduce.hpp): the
// format of a compressed chunk and the arithmetic of one element, written
// once for the host kernels (host/grad_compression.hpp) and the CUDA ones
// (cuda/grad_compression.cu), so both send and sum the same bits.
//
// A bucket of n gradients goes out as `parts` chunks of c = ceil(n / parts)
// elements (the last ones short or empty; the missing elements count as
// zeros). A chunk is, in bf16, c 16-bit values; in int8, one float scale
// per block of kQuantBlock elements (the block's largest magnitude / 127),
// then c signed bytes. Each chunk is padded to a multiple of 4 bytes.
//
// Error feedback (Seide et al. 2014; Karimireddy et al. 2019; 1-bit Adam):
// what a value loses to rounding is kept, x - D(Q(x)), and added to the
// same element before the next compression, so nothing is lost for good.
// Every product that meets a sum is an explicit fma (see adamw_math.hpp):
// the host and the device round alike.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/bf16.hpp"

#ifndef MPIFORMER_HOST_DEVICE
#if defined(__CUDACC__)
#define MPIFORMER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MPIFORMER_HOST_DEVICE inline
#endif
#endif

namespace mpiformer {

inline constexpr int64_t kQuantBlock = 256;

// Bytes of one compressed chunk of c elements (`int8`: else bf16).
inline int64_t compressed_chunk_bytes(bool int8, int64_t c) {
  const int64_t raw = int8 ? 4 * ((c + kQuantBlock - 1) / kQuantBlock) + c : 2 * c;
  return (raw + 3) / 4 * 4;
}
// The codes after a chunk's c that pad it to whole words (zeros on the
// wire, so a chunk's bytes are a function of its values).
MPIFORMER_HOST_DEVICE int64_t chunk_padding(bool int8, int64_t c) {
  return int8 ? (4 - c % 4) % 4 : c % 2;
}
// Elements of each chunk when n go out as `parts`.
inline int64_t chunk_elements(int64_t n, int parts) { return (n + parts - 1) / parts; }

// int8: a block's scale from its largest magnitude; an element's code and
// value under it (a zero block: scale 0, codes 0). A block with a value
// that is not finite gets a NaN scale: every value of it reads back NaN,
// so the step's guard sees the fault as it would uncompressed.
MPIFORMER_HOST_DEVICE float gc_scale(float amax, bool finite) {
  return finite ? amax / 127.0f : bf16_to_float(0x7fc0);
}
MPIFORMER_HOST_DEVICE int8_t gc_to_int8(float x, float scale) {
  if (!(scale > 0.0f)) return 0;
  const float q = rintf(x / scale);
  return static_cast<int8_t>(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
}
// x - D(q): what error feedback keeps.
MPIFORMER_HOST_DEVICE float gc_int8_left(float x, int8_t q, float scale) {
  return fmaf(-static_cast<float>(q), scale, x);
}
// s + D(q): the sum of the parts.
MPIFORMER_HOST_DEVICE float gc_int8_add(float s, int8_t q, float scale) {
  return fmaf(static_cast<float>(q), scale, s);
}

}  // namespace mpiformer
