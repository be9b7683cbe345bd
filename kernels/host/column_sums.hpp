// sums[c] += sum over rows of x[r, c], for row-major x [N, C].
// Parallel over blocks of columns, rows in order inside a block: each sum
// has a fixed order (deterministic), and the innermost loop runs along a
// row, contiguous in memory (a loop down a column would stride by C).
// x may be a 16-bit storage type; the sums are in its compute type.
#pragma once
#include <algorithm>
#include <cstdint>

#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

constexpr int64_t kColumnBlock = 64;

template <class A, class F = compute_t<A>>
void column_sums_accumulate(F* sums, const A* x, int64_t N, int64_t C) {
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  parallel_for("column_sums", blocks, [=](const int64_t blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    F acc[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const A* row = x + n * C;
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += ld(row[c]);
    }
    for (int64_t c = c0; c < c1; ++c) sums[c] += acc[c - c0];
  });
}

}  // namespace mpiformer::host
