// layernorm: forward against a two-pass naive loop in double; backward
// (dinp accumulates, like the residual stream it feeds) against central
// finite differences.
#include "host/layernorm.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

constexpr int64_t N = 5, C = 16;

std::vector<double> naive_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                    const std::vector<double>& b) {
  std::vector<double> out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c] / C;
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m) / C;
    for (int64_t c = 0; c < C; ++c)
      out[n * C + c] = (x[n * C + c] - m) / std::sqrt(v + 1e-5) * w[c] + b[c];
  }
  return out;
}

TEST(LayerNorm, ForwardMatchesNaiveLoops) {
  auto x = random_vector(N * C, 11, 2.0), w = random_vector(C, 12), b = random_vector(C, 13);
  for (auto& v : x) v += 3.0;  // a non-zero mean exercises the centring
  const auto want = naive_layernorm(x, w, b);
  std::vector<double> out(N * C, -9), mean(N), rstd(N);
  host::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  EXPECT_TRUE(all_close(out, want, 1e-12, 1e-12));

  auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b);
  std::vector<float> outf(N * C), meanf(N), rstdf(N);
  host::layernorm_forward(outf.data(), meanf.data(), rstdf.data(), xf.data(), wf.data(), bf.data(),
                          N, C);
  EXPECT_TRUE(all_close(outf, want, 1e-5, 1e-4));
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  auto x = random_vector(N * C, 14), w = random_vector(C, 15), b = random_vector(C, 16);
  const auto r = random_vector(N * C, 17);
  auto loss = [&] { return dot(naive_layernorm(x, w, b), r); };
  const auto dx_want = finite_difference(x, loss, 1e-6);
  const auto dw_want = finite_difference(w, loss, 1e-6);
  const auto db_want = finite_difference(b, loss, 1e-6);

  std::vector<double> out(N * C), mean(N), rstd(N);
  host::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  std::vector<double> dx(N * C, 1.5), dw(C, 2.0), db(C, -1.0);
  host::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
  for (auto& v : dx) v -= 1.5;
  for (auto& v : dw) v -= 2.0;
  for (auto& v : db) v += 1.0;
  EXPECT_TRUE(all_close(dx, dx_want, 1e-7, 1e-6)) << "dinp (accumulated)";
  EXPECT_TRUE(all_close(dw, dw_want, 1e-7, 1e-6));
  EXPECT_TRUE(all_close(db, db_want, 1e-7, 1e-6));
}

}  // namespace
}  // namespace mpiformer::test
