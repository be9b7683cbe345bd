// Rotary position embeddings (RoFormer; Llama), applied in place to the
// query and key heads of a fused qkv buffer [N, C + 2K] (q: C = NH*hs
// channels, k: K = NKV*hs, then v, untouched). Row n is position n % T.
// Channel pairs are (i, i + hs/2) of each head, the "rotate half" pairing
// Hugging Face's Llama uses: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
// `table` [T, hs/2, 2] holds (cos, sin) of position t times frequency i,
// theta^(-2i/hs), computed once on the host in double (rope_table) so
// both back ends rotate by the same values. Backward is the rotation by
// the opposite angle (the transpose), in place on dqkv's q and k.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

// (cos, sin) of every (position, frequency), [T, hs/2, 2], as float.
inline std::vector<float> rope_table(int64_t T, int64_t hs, double theta) {
  std::vector<float> t(static_cast<size_t>(T * hs));
  const int64_t half = hs / 2;
  for (int64_t p = 0; p < T; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a =
          static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
      t[static_cast<size_t>((p * half + i) * 2)] = static_cast<float>(std::cos(a));
      t[static_cast<size_t>((p * half + i) * 2 + 1)] = static_cast<float>(std::sin(a));
    }
  return t;
}

// sign +1: forward; -1: backward (rotation by -angle). `positions` [N]:
// each row's position in its document (nullptr: n % T).
template <class A>
void rope_rotate(A* qkv, const float* table, int64_t N, int64_t Tn, int64_t C, int64_t K,
                 int64_t hs, float sign, const int32_t* positions = nullptr) {
  using T = compute_t<A>;
  const int64_t width = C + 2 * K, heads = (C + K) / hs, half = hs / 2;
  parallel_for("rope", N, [=](const int64_t n) {
    const float* cs = table + (positions != nullptr ? positions[n] : n % Tn) * half * 2;
    A* row = qkv + n * width;
    for (int64_t h = 0; h < heads; ++h) {
      A* x = row + h * hs;
      for (int64_t i = 0; i < half; ++i) {
        const T c = static_cast<T>(cs[2 * i]), s = static_cast<T>(sign * cs[2 * i + 1]);
        const T x1 = ld(x[i]), x2 = ld(x[i + half]);
        x[i] = st<A>(x1 * c - x2 * s);
        x[i + half] = st<A>(x2 * c + x1 * s);
      }
    }
  });
}

}  // namespace mpiformer::host
