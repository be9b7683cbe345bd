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

// The plan's name for a host element type.
template <class A>
constexpr Element element_of() {
  if constexpr (std::is_same_v<A, Bf16>) return Element::kBf16;
  else if constexpr (std::is_same_v<A, Fp16>) return Element::kF16;
  else if constexpr (std::is_same_v<A, double>) return Element::kF64;
  else return Element::kF32;
}

}  // namespace mpiformer::host
