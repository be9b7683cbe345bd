// matmul: forward against a naive triple loop; backward against central
// finite differences, all in double. Float forward is checked too with a
// tolerance for fp32 sums of C = 24 products (abs 1e-5 + rel 1e-4).
#include "host/matmul.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

constexpr int64_t N = 6, C = 24, OC = 10;

std::vector<double> naive_linear(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>* b) {
  std::vector<double> out(N * OC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int64_t c = 0; c < C; ++c) s += x[n * C + c] * w[o * C + c];
      out[n * OC + o] = s;
    }
  return out;
}

TEST(Matmul, ForwardMatchesNaiveLoops) {
  const auto x = random_vector(N * C, 1), w = random_vector(OC * C, 2), b = random_vector(OC, 3);
  const auto want = naive_linear(x, w, &b);
  std::vector<double> out(N * OC, -99);
  host::matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  EXPECT_TRUE(all_close(out, want, 1e-12, 1e-12));

  auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b);
  std::vector<float> outf(N * OC, -99);
  host::matmul_forward(outf.data(), xf.data(), wf.data(), bf.data(), N, C, OC);
  EXPECT_TRUE(all_close(outf, want, 1e-5, 1e-4));

  // No bias (the tied LM head): the output must not keep its old contents.
  std::vector<double> out_nb(N * OC, 123.0);
  host::matmul_forward(out_nb.data(), x.data(), w.data(), static_cast<const double*>(nullptr), N,
                       C, OC);
  EXPECT_TRUE(all_close(out_nb, naive_linear(x, w, nullptr), 1e-12, 1e-12));
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
  auto x = random_vector(N * C, 4), w = random_vector(OC * C, 5), b = random_vector(OC, 6);
  const auto r = random_vector(N * OC, 7);  // dL/dout: L = sum(out * r)
  auto loss = [&] { return dot(naive_linear(x, w, &b), r); };
  const auto dx_want = finite_difference(x, loss, 1e-6);
  const auto dw_want = finite_difference(w, loss, 1e-6);
  const auto db_want = finite_difference(b, loss, 1e-6);

  // Parameter gradients accumulate: start them at a known non-zero value.
  std::vector<double> dx(N * C, 7.0), dw(OC * C, 0.5), db(OC, -0.25);
  host::matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, C, OC);
  for (auto& v : dw) v -= 0.5;
  for (auto& v : db) v += 0.25;
  // Central differences in double: truncation O(h^2) and rounding
  // O(eps |L| / h) are both below 1e-8 here.
  EXPECT_TRUE(all_close(dx, dx_want, 1e-7, 1e-6)) << "dinp (overwritten)";
  EXPECT_TRUE(all_close(dw, dw_want, 1e-7, 1e-6)) << "dweight (accumulated)";
  EXPECT_TRUE(all_close(db, db_want, 1e-7, 1e-6)) << "dbias (accumulated)";
}

}  // namespace
}  // namespace mpiformer::test
