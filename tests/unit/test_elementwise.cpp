// GELU, residual and embedding: forward against the formulas written out
// in double, backward against central finite differences.
#include "host/embedding.hpp"
#include "host/gelu.hpp"
#include "host/fast_math.hpp"
#include "host/residual.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

double naive_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(Gelu, ForwardAndBackward) {
  auto x = random_vector(64, 41, 2.0);
  std::vector<double> out(64), want(64);
  for (size_t i = 0; i < x.size(); ++i) want[i] = naive_gelu(x[i]);
  host::gelu_forward(out.data(), x.data(), 64);
  EXPECT_TRUE(all_close(out, want, 1e-14, 1e-14));

  const auto r = random_vector(64, 42);
  auto loss = [&] {
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += naive_gelu(x[i]) * r[i];
    return s;
  };
  const auto dwant = finite_difference(x, loss, 1e-6);
  std::vector<double> dx(64, 9.0);
  host::gelu_backward(dx.data(), x.data(), r.data(), 64);
  EXPECT_TRUE(all_close(dx, dwant, 1e-8, 1e-6));
}

TEST(Residual, Forward) {
  const auto a = random_vector(10, 43), b = random_vector(10, 44);
  std::vector<double> out(10), want(10);
  for (size_t i = 0; i < 10; ++i) want[i] = a[i] + b[i];
  host::residual_forward(out.data(), a.data(), b.data(), 10);
  EXPECT_TRUE(all_close(out, want, 0, 0));
}

TEST(Embedding, ForwardAndBackwardWithRepeatedTokens) {
  constexpr int64_t B = 2, T = 3, C = 4, V = 5;
  auto wte = random_vector(V * C, 45), wpe = random_vector(T * C, 46);
  const std::vector<int32_t> tok = {1, 4, 1, 0, 1, 4};  // repeats must add, not overwrite
  auto naive = [&] {
    std::vector<double> out(B * T * C);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c)
          out[(b * T + t) * C + c] = wte[tok[b * T + t] * C + c] + wpe[t * C + c];
    return out;
  };
  std::vector<double> out(B * T * C);
  host::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_TRUE(all_close(out, naive(), 0, 0));

  const auto r = random_vector(B * T * C, 47);
  auto loss = [&] { return dot(naive(), r); };
  const auto dwte_want = finite_difference(wte, loss, 1e-6);
  const auto dwpe_want = finite_difference(wpe, loss, 1e-6);
  std::vector<double> dwte(V * C, 0.0), dwpe(T * C, 0.0);
  host::embedding_backward(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C);
  EXPECT_TRUE(all_close(dwte, dwte_want, 1e-8, 1e-6));
  EXPECT_TRUE(all_close(dwpe, dwpe_want, 1e-8, 1e-6));
}

// The vocabulary-parallel embedding by token rows: each of 3 "ranks"
// embeds the positions whose tokens its slice holds, in the order of
// positions by holder; moved to their positions, the rows are the whole
// embedding, bit for bit.
TEST(Embedding, TokenRowsOfEverySliceMakeTheWholeEmbedding) {
  constexpr int64_t B = 3, T = 5, C = 4, V = 12, tp = 3, rows = V / tp;
  auto wte = random_vector(V * C, 48), wpe = random_vector(T * C, 49);
  const std::vector<int32_t> tok = {0, 11, 4, 4, 7, 3, 8, 1, 11, 0, 5, 6, 2, 9, 10};
  std::vector<double> want(B * T * C);
  host::embedding_forward(want.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  // Positions by holder (tokens [4 r, 4 r + 4) on rank r), increasing within.
  std::vector<int32_t> order;
  std::vector<int64_t> first(tp + 1, 0);
  for (int64_t r = 0; r < tp; ++r) {
    for (int32_t p = 0; p < B * T; ++p)
      if (tok[p] / rows == r) order.push_back(p);
    first[r + 1] = static_cast<int64_t>(order.size());
  }
  std::vector<double> gathered(B * T * C, std::nan("")), out(B * T * C, std::nan(""));
  for (int64_t r = 0; r < tp; ++r)
    host::embedding_forward_rows(gathered.data() + first[r] * C, tok.data(), order.data(), first[r],
                                 first[r + 1] - first[r], wte.data() + r * rows * C, wpe.data(), T,
                                 C, r * rows);
  host::scatter_rows(out.data(), gathered.data(), order.data(), B * T, C);
  EXPECT_TRUE(all_close(out, want, 0, 0));
}

}  // namespace
}  // namespace mpiformer::test

namespace mpiformer::test {
namespace {

// The float path uses a polynomial exp (fast_math.hpp). Against libm in
// double over the whole range the kernels see: relative 1e-6 (about 8 ulp,
// the polynomial is near 2) for exp; tanh and GELU absolute 2e-7 + relative
// 1e-6, since tanh is computed as 1 - 2/(e^2u + 1) and loses relative
// precision, not absolute, near zero.
TEST(FastMath, FloatExpTanhAndGeluMatchLibm) {
  for (double x = -87.0; x <= 88.0; x += 0.01) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    ASSERT_NEAR(host::exp_fast(xf), want, 1e-6 * want) << x;
  }
  std::vector<float> xs, got;
  std::vector<double> want;
  for (double x = -12.0; x <= 12.0; x += 0.001) {
    const float xf = static_cast<float>(x);
    ASSERT_NEAR(host::tanh_fast(xf), std::tanh(static_cast<double>(xf)), 2e-7 + 1e-6 * std::fabs(std::tanh(x)));
    xs.push_back(xf);
    want.push_back(naive_gelu(static_cast<double>(xf)));
  }
  got.resize(xs.size());
  host::gelu_forward(got.data(), xs.data(), static_cast<int64_t>(xs.size()));
  EXPECT_TRUE(all_close(got, want, 1e-6, 1e-6));
  EXPECT_EQ(host::exp_fast(-1000.0f), host::exp_fast(-87.3f));  // clamped, no NaN or denormal trap
  EXPECT_TRUE(std::isfinite(host::exp_fast(1000.0f)));
}

}  // namespace
}  // namespace mpiformer::test
