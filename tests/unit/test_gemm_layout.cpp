// cuBLASLt's descriptors for every GEMM the CUDA stage issues
// (cuda/gemm_layout.hpp), checked on the CPU: the column-major product the
// descriptors describe, computed by a naive column-major reference that
// reads memory only through them, equals the row-major product the kernels
// mean, computed from its own definition, at sampled elements of every
// batch. Also: every layout is a legal cuBLASLt layout (leading dimension
// at least the rows, batches that do not overlap), and every element
// either side reads lies inside the operand the call hands over.
//
// Shapes: gpt2-124m and gpt2-350m at seq_len 1024 and micro-batch 4, tensor
// parallel widths 1, 2 and 4 (each rank's slice: qkv and fc columns, the
// projections' rows, the vocabulary, the heads). Operand values are a hash
// of the element's offset, so nothing of real size is allocated and an
// element read from the wrong place gives another value.
//
// Tolerance: both sides sum the same K products in double in the same order
// (p = 0..K-1), so they agree exactly; the values are small integers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda/gemm_layout.hpp"
#include "cuda/plan_cache.hpp"

namespace mpiformer::test {
namespace {

using cuda::GemmCall;
using cuda::LtGemm;
using cuda::LtMatrix;

// An operand's value at an element offset: a small integer from a hash,
// distinct per operand (`salt`).
double value(int64_t offset, uint64_t salt) {
  uint64_t x = static_cast<uint64_t>(offset) * 0x9E3779B97F4A7C15ull + salt;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<double>(x % 17) - 8.0;
}
constexpr uint64_t kSaltA = 11, kSaltB = 23, kSaltBias = 37;

// Elements a row-major operand of `rows` x `cols` (row stride ld) spans, a
// batch of `count` at `stride`.
int64_t extent(int64_t rows, int64_t cols, int64_t ld, int64_t count, int64_t stride) {
  return (count - 1) * stride + (rows - 1) * ld + cols;
}

struct Failure {
  std::string what;
};

// The row-major definition: C[b][r][c] = sum_p op(A)[r,p] op(B)[p,c]
// (+ bias[c]), reading A and B at the offsets the call implies.
double row_major(const GemmCall& g, int64_t b, int64_t r, int64_t c) {
  double sum = 0;
  for (int64_t p = 0; p < g.k; ++p) {
    const int64_t ai = b * g.batch.stride_a + (g.trans_a ? p * g.lda + r : r * g.lda + p);
    const int64_t bi = b * g.batch.stride_b + (g.trans_b ? c * g.ldb + p : p * g.ldb + c);
    sum += value(ai, kSaltA) * value(bi, kSaltB);
  }
  return sum + (g.bias ? value(c, kSaltBias) : 0.0);
}

// The column-major product the descriptors describe: D[b](i,j) = sum_p
// op(first)(i,p) op(second)(p,j) (+ bias[i]), element (x,y) of a
// column-major matrix at x + y * ld. `first` is the memory the call hands
// as B, `second` as A; every offset read is checked against what the
// call's operand spans.
double column_major(const LtGemm& lt, int64_t b, int64_t i, int64_t j, int64_t first_len,
                    int64_t second_len, Failure* f) {
  const auto at = [](const LtMatrix& x, bool trans, int64_t row, int64_t col) {
    return trans ? col + row * x.ld : row + col * x.ld;  // op(X)(row, col)
  };
  double sum = 0;
  for (int64_t p = 0; p < lt.k; ++p) {
    const int64_t fi = b * lt.first.batch_stride + at(lt.first, lt.trans_first, i, p);
    const int64_t si = b * lt.second.batch_stride + at(lt.second, lt.trans_second, p, j);
    if (fi < 0 || fi >= first_len || si < 0 || si >= second_len) {
      f->what = "reads outside an operand";
      return 0;
    }
    sum += value(fi, kSaltB) * value(si, kSaltA);
  }
  return sum + (lt.bias ? value(i, kSaltBias) : 0.0);
}

// Legal for cuBLASLt, and consistent with the product's shape.
std::string layout_error(const LtGemm& lt) {
  const auto op_shape = [](const LtMatrix& x, bool trans) {
    return trans ? std::pair{x.cols, x.rows} : std::pair{x.rows, x.cols};
  };
  if (op_shape(lt.first, lt.trans_first) != std::pair{lt.m, lt.k}) return "op(first) is not m x k";
  if (op_shape(lt.second, lt.trans_second) != std::pair{lt.k, lt.n}) return "op(second) is not k x n";
  if (lt.out.rows != lt.m || lt.out.cols != lt.n) return "out is not m x n";
  for (const LtMatrix* x : {&lt.first, &lt.second, &lt.out}) {
    if (x->rows < 1 || x->cols < 1) return "an empty matrix";
    if (x->ld < x->rows) return "a leading dimension below the rows";
    if (lt.batch > 1 && x->batch_stride < x->ld * (x->cols - 1) + x->rows)
      return "matrices of a batch overlap";
  }
  return "";
}

void check(const GemmCall& g, const std::string& name) {
  SCOPED_TRACE(name);
  const LtGemm lt = cuda::lt_gemm(g);
  const std::string err = layout_error(lt);
  ASSERT_EQ(err, "") << err;
  const int64_t a_len = extent(g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.batch.count,
                               g.batch.stride_a);
  const int64_t b_len = extent(g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.batch.count,
                               g.batch.stride_b);
  const int64_t c_len = extent(g.m, g.n, g.ldc, g.batch.count, g.batch.stride_c);
  // The corners, then random elements, of the first and last matrix.
  std::mt19937_64 gen(static_cast<uint64_t>(g.m * 31 + g.n * 7 + g.k));
  std::vector<std::pair<int64_t, int64_t>> at = {
      {0, 0}, {g.m - 1, g.n - 1}, {0, g.n - 1}, {g.m - 1, 0}};
  for (int s = 0; s < 6; ++s)
    at.push_back({static_cast<int64_t>(gen() % static_cast<uint64_t>(g.m)),
                  static_cast<int64_t>(gen() % static_cast<uint64_t>(g.n))});
  for (int64_t b : {int64_t{0}, g.batch.count - 1}) {
    for (const auto& [r, c] : at) {
      // Row-major C[r,c] is column-major D(c,r): the same address.
      const int64_t c_off = b * g.batch.stride_c + r * g.ldc + c;
      const int64_t d_off = b * lt.out.batch_stride + c + r * lt.out.ld;
      ASSERT_EQ(c_off, d_off) << "C and D place element (" << r << "," << c << ") apart";
      ASSERT_LT(c_off, c_len);
      Failure f;
      const double want = row_major(g, b, r, c);
      const double got = column_major(lt, b, c, r, b_len, a_len, &f);
      ASSERT_EQ(f.what, "") << f.what << " at batch " << b << " (" << r << "," << c << ")";
      ASSERT_EQ(got, want) << "batch " << b << " element (" << r << "," << c << ")";
    }
  }
}

struct Model {
  const char* name;
  int64_t n_layer, n_head, n_embd;
};

TEST(GemmLayout, EveryStageGemmOfGpt2AtEachTensorWidth) {
  const int64_t T = 1024, B = 4, N = B * T, vocab_padded = 50304;
  for (const Model& m : {Model{"gpt2-124m", 12, 12, 768}, Model{"gpt2-350m", 24, 16, 1024}}) {
    for (int64_t tp : {1, 2, 4}) {
      const int64_t C = m.n_embd, hs = C / m.n_head, heads = m.n_head / tp;
      const std::string at = std::string(m.name) + " tp " + std::to_string(tp) + ": ";
      // (in, out) of each linear, as a tensor rank holds it: column-parallel
      // qkv and fc, row-parallel projections, the vocabulary-parallel head.
      const std::pair<int64_t, int64_t> linears[] = {
          {C, 3 * C / tp}, {C / tp, C}, {C, 4 * C / tp}, {4 * C / tp, C}, {C, vocab_padded / tp}};
      for (const auto& [in, out] : linears) {
        const std::string shape = std::to_string(in) + "->" + std::to_string(out);
        check(cuda::matmul_forward_gemm(N, in, out, true), at + "forward " + shape);
        check(cuda::matmul_forward_gemm(N, in, out, false), at + "forward, no bias, " + shape);
        check(cuda::matmul_dinp_gemm(N, in, out), at + "input gradient " + shape);
        check(cuda::matmul_dweight_gemm(N, in, out), at + "weight gradient " + shape);
      }
      // ZeRO 3's vocabulary pieces: the head's columns [r0, r0 + rows) of
      // the logits, rows apart by the whole share (StageLayout::piece: a
      // block's 12 C^2 + 13 C floats hold 9229 rows at 768, cut to 9224).
      const int64_t share = vocab_padded / tp, rows = std::min<int64_t>(9224, share / 2);
      const std::string piece = std::to_string(rows) + " of " + std::to_string(share) + " columns";
      check(cuda::matmul_forward_gemm(N, C, rows, false, share), at + "head piece " + piece);
      check(cuda::matmul_dinp_gemm(N, C, rows, share), at + "head piece input gradient " + piece);
      check(cuda::matmul_dweight_gemm(N, C, rows, share), at + "head piece weight gradient " + piece);
      const cuda::AttentionGemms g = cuda::attention_gemms(B * heads, T, hs);
      check(g.scores, at + "attention scores");
      check(g.values, at + "attention values");
      check(g.dprobs, at + "attention probabilities' gradient");
      check(g.dvalues, at + "attention values' gradient");
      check(g.dqueries, at + "attention queries' gradient");
      check(g.dkeys, at + "attention keys' gradient");
    }
  }
}

// The reference can fail: a descriptor with the operands not swapped, or a
// leading dimension taken from the other operand, is caught.
TEST(GemmLayout, TheReferenceCatchesAWrongDescriptor) {
  const GemmCall g = cuda::matmul_forward_gemm(64, 48, 80, true);
  LtGemm unswapped = cuda::lt_gemm(g);
  std::swap(unswapped.first, unswapped.second);
  std::swap(unswapped.trans_first, unswapped.trans_second);
  EXPECT_NE(layout_error(unswapped), "");
  LtGemm wrong_ld = cuda::lt_gemm(cuda::matmul_dinp_gemm(64, 48, 80));
  wrong_ld.second.ld = 48;  // the weight's row length, not dout's
  Failure f;
  const GemmCall d = cuda::matmul_dinp_gemm(64, 48, 80);
  const double want = row_major(d, 0, 5, 7);
  const double got = column_major(wrong_ld, 0, 7, 5, 80 * 48, 64 * 80, &f);
  EXPECT_TRUE(!f.what.empty() || got != want);
}

// The plans' LRU keeps the most recent entries, releases each evicted one
// exactly once (and the rest at the end), and a found entry counts as used.
TEST(GemmPlanCache, LruKeepsTheRecentAndReleasesTheRest) {
  std::vector<int> released;
  {
    cuda::LruMap<int, int> lru(3, [&](int& v) { released.push_back(v); });
    for (int k = 0; k < 3; ++k) lru.insert(k, 10 * k);
    ASSERT_NE(lru.find(0), nullptr);  // 0 is now the most recent
    lru.insert(3, 30);                // evicts 1, the least recent
    EXPECT_EQ(released, std::vector<int>{10});
    EXPECT_EQ(lru.find(1), nullptr);
    EXPECT_EQ(*lru.find(0), 0);
    EXPECT_EQ(lru.size(), 3u);
  }
  std::sort(released.begin(), released.end());
  EXPECT_EQ(released, (std::vector<int>{0, 10, 20, 30}));
}

// Rows' buckets: every count in a bucket at most its top, the top at most
// 12.5% above it (the GEMM an algorithm was chosen for is never much
// larger), powers of two and B x T their own bucket, and the number of
// buckets up to 2^20 rows small (a plan cache keyed by them stays small).
TEST(GemmPlanCache, RowBuckets) {
  std::set<int64_t> tops;
  for (int64_t m = 1; m <= (int64_t{1} << 20); ++m) {
    const int64_t top = cuda::gemm_rows_bucket(m);
    ASSERT_GE(top, m);
    ASSERT_LE(static_cast<double>(top), 1.125 * static_cast<double>(m)) << m;
    ASSERT_EQ(cuda::gemm_rows_bucket(top), top) << m;
    tops.insert(top);
  }
  EXPECT_LE(tops.size(), 16u + 8u * 17u);
  for (const int64_t m : {int64_t{1024}, int64_t{16 * 1024}, int64_t{24576}, int64_t{8 * 2048}})
    EXPECT_EQ(cuda::gemm_rows_bucket(m), m);
  EXPECT_EQ(cuda::gemm_rows_bucket(1000), 1024);
  EXPECT_EQ(cuda::gemm_rows_bucket(1025), 1152);
}

}  // namespace
}  // namespace mpiformer::test
