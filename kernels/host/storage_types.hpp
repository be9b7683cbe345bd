// The host's 16-bit storage types. Bf16 and Fp16 hold bits only: a kernel
// widens what it reads to its compute type (float) with ld(), works in
// float, and rounds once when it stores with st<A>() (round to nearest
// even, core/bf16.hpp and core/fp16.hpp: the GPU's __float2bfloat16 and
// __float2half_rn). float and double are their own compute types, so a
// kernel written with ld/st is, in fp32, the fp32 kernel bit for bit.
// Conversions are explicit: nothing narrows silently.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/bf16.hpp"
#include "core/fp16.hpp"
#include "core/precision_plan.hpp"

namespace mpiformer::host {

struct Bf16 {
  uint16_t bits;
  Bf16() = default;
  explicit Bf16(float f) : bits(float_to_bf16(f)) {}
  explicit operator float() const { return bf16_to_float(bits); }
};

struct Fp16 {
  uint16_t bits;
  Fp16() = default;
  explicit Fp16(float f) : bits(float_to_fp16(f)) {}
  explicit operator float() const { return fp16_to_float(bits); }
};

static_assert(sizeof(Bf16) == 2 && sizeof(Fp16) == 2 && std::is_trivial_v<Bf16> &&
              std::is_trivial_v<Fp16>);

template <class A>
inline constexpr bool kNarrow = std::is_same_v<A, Bf16> || std::is_same_v<A, Fp16>;

// What a kernel computes in when it stores A.
template <class A>
using compute_t = std::conditional_t<kNarrow<A>, float, A>;

template <class A>
inline compute_t<A> ld(A x) {
  return static_cast<compute_t<A>>(x);
}
template <class A, class F>
inline A st(F x) {
  if constexpr (kNarrow<A>) return A(static_cast<float>(x));
  else return static_cast<A>(x);
}

// n elements widened to float, and narrowed back (rounded once): the bulk
// conversions of the widened products and attention's head slices. fp16
// uses F16C's 8-wide instructions where the build targets them (GCC does
// not vectorise the scalar ones); the results are the scalar conversions'.
template <class A>
inline void widen_n(float* __restrict dst, const A* __restrict src, int64_t n) {
  int64_t i = 0;
#ifdef MPIFORMER_F16C
  if constexpr (std::is_same_v<A, Fp16>)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(ld(src[i]));
}
template <class A>
inline void narrow_n(A* __restrict dst, const float* __restrict src, int64_t n) {
  int64_t i = 0;
#ifdef MPIFORMER_F16C
  if constexpr (std::is_same_v<A, Fp16>)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = st<A>(src[i]);
}

// The plan's name for a host element type.
template <class A>
constexpr Element element_of() {
  if constexpr (std::is_same_v<A, Bf16>) return Element::kBf16;
  else if constexpr (std::is_same_v<A, Fp16>) return Element::kF16;
  else if constexpr (std::is_same_v<A, double>) return Element::kF64;
  else return Element::kF32;
}

}  // namespace mpiformer::host
