// exp and tanh that the compiler can vectorise. libm's expf/tanhf are scalar
// calls (GCC only maps them to vector versions under -ffast-math), and GELU
// and softmax spend most of their time in them. In float these use
// Cody-Waite range reduction and a degree-6 polynomial (Cephes' expf
// coefficients): relative error about 2 ulp. In double (gradient checks)
// they are libm's, exactly.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mpiformer::host {

inline float exp_fast(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  const float n = std::nearbyint(x * 1.44269504088896341f);  // x / ln 2
  float r = x - n * 0.693359375f;                            // ln 2, split so the
  r -= n * -2.12194440e-4f;                                  // product is exact
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // Scale by 2^n through the exponent bits.
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
inline double exp_fast(double x) { return std::exp(x); }

// tanh(u) = 1 - 2 / (exp(2u) + 1): saturates cleanly at +-1; absolute error
// near 1e-7 around zero, where GELU multiplies it by x anyway.
inline float tanh_fast(float u) { return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f); }
inline double tanh_fast(double u) { return std::tanh(u); }

// Row reductions of the softmaxes, vectorised: a running sum in order is a
// dependency chain the compiler must keep (no -ffast-math), so the terms go
// to kLanes partial sums in a fixed order, added up in order at the end:
// the same result whatever the thread, and the exponentials vectorise.
inline constexpr int64_t kLanes = 16;

// The largest of x[0, n), n >= 1 (exact in any order).
template <class T>
T max_of(const T* x, int64_t n) {
  T mx = x[0];
  int64_t i = 0;
  if (n >= kLanes) {
    T lanes[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = x[j];
    for (i = kLanes; i + kLanes <= n; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
    for (int64_t j = 0; j < kLanes; ++j) mx = lanes[j] > mx ? lanes[j] : mx;
  }
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  return mx;
}

// The sum of a[i] * b[i] over [0, n).
template <class T>
T dot_of(const T* a, const T* b, int64_t n) {
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += a[i + j] * b[i + j];
  T sum = 0;
  for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// x[i] = exp(x[i] - shift) for i in [0, n); returns their sum.
template <class T>
T exp_shift_sum(T* x, int64_t n, T shift) {
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) {
      x[i + j] = exp_fast(x[i + j] - shift);
      lanes[j] += x[i + j];
    }
  T sum = 0;
  for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
  for (; i < n; ++i) {
    x[i] = exp_fast(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

}  // namespace mpiformer::host
