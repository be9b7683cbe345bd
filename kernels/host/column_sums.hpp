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

// sums[c] += sum over rows n of term(n, c), in the same order: the form of
// every parameter gradient that sums over rows (a bias's, a norm's weight's).
template <class F, class Term>
void column_term_sums(F* sums, int64_t N, int64_t C, Term term) {
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  parallel_for("column_sums", blocks, [=](const int64_t blk) {
    const int64_t c0 = blk * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
    F acc[kColumnBlock] = {};
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += term(n, c);
    for (int64_t c = c0; c < c1; ++c) sums[c] += acc[c - c0];
  });
}

template <class A, class F = compute_t<A>>
void column_sums_accumulate(F* sums, const A* x, int64_t N, int64_t C) {
  column_term_sums(sums, N, C, [=](int64_t n, int64_t c) { return static_cast<F>(ld(x[n * C + c])); });
}

}  // namespace mpiformer::host
