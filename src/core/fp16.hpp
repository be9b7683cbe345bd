// IEEE binary16 on the host, as bits. Narrowing rounds to nearest even,
// overflow to infinity (as CUDA's __float2half_rn and F16C's vcvtps2ph do),
// subnormals kept, NaN staying NaN; widening is exact. For fp16 storage on
// the host and data that crosses the host in fp16.
//
// Where the compiler targets F16C (x86 since 2012, -march=native here) the
// conversions are its instructions, which round the same way (the unit
// test checks every half and a sweep of floats against the bit version).
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#define MPIFORMER_F16C 1
#endif

namespace mpiformer {

// The portable versions (and the reference the F16C ones are tested against).
inline float fp16_to_float_bits(uint16_t h);
inline uint16_t float_to_fp16_bits(float f);

inline float fp16_to_float(uint16_t h) {
#ifdef MPIFORMER_F16C
  return _cvtsh_ss(h);
#else
  return fp16_to_float_bits(h);
#endif
}

inline uint16_t float_to_fp16(float f) {
#ifdef MPIFORMER_F16C
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
  return float_to_fp16_bits(f);
#endif
}

inline float fp16_to_float_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_fp16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t out;
  if (u >= (143u << 23)) {  // |f| >= 2^16 (or inf, NaN): no finite half
    out = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {
    // Below the smallest normal half (2^-14): adding 0.5 lines the half's
    // subnormal grid up with float's last mantissa bits, and the float
    // addition rounds to nearest even for us.
    const uint32_t magic_bits = 126u << 23;
    float magic, sum;
    std::memcpy(&magic, &magic_bits, sizeof magic);
    float a;
    std::memcpy(&a, &u, sizeof a);
    sum = a + magic;
    uint32_t s;
    std::memcpy(&s, &sum, sizeof s);
    out = s - magic_bits;
  } else {
    // Rebias the exponent and round the 13 dropped bits to nearest even; a
    // carry out of the mantissa moves into the exponent (up to infinity).
    const uint32_t odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    out = u >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

}  // namespace mpiformer
