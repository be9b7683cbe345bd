// Softmax cross-entropy over a padded vocabulary: losses against a naive
// log-sum-exp; the fused gradient against central finite differences; the
// padded columns must neither change the loss nor receive gradient.
#include "host/crossentropy.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

constexpr int64_t N = 4, V = 7, Vp = 12;

std::vector<double> naive_losses(const std::vector<double>& z, const std::vector<int32_t>& y) {
  std::vector<double> out(N);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += std::exp(z[n * Vp + i]);
    out[n] = std::log(s) - z[n * Vp + y[n]];
  }
  return out;
}

TEST(CrossEntropy, ForwardIgnoresPaddingAndMatchesNaive) {
  auto z = random_vector(N * Vp, 31, 3.0);
  const std::vector<int32_t> y = {0, 6, 3, 2};
  const auto want = naive_losses(z, y);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = V; i < Vp; ++i) z[n * Vp + i] = 1e3;  // would dominate if not ignored
  std::vector<double> losses(N);
  host::crossentropy_forward(losses.data(), z.data(), y.data(), N, V, Vp);
  EXPECT_TRUE(all_close(losses, want, 1e-12, 1e-12));
}

TEST(CrossEntropy, FusedGradientMatchesFiniteDifferences) {
  auto z = random_vector(N * Vp, 32, 2.0);
  const std::vector<int32_t> y = {1, 5, 0, 6};
  const double scale = 1.0 / N;
  auto loss = [&] {
    double s = 0;
    for (double l : naive_losses(z, y)) s += l;
    return scale * s;
  };
  const auto want = finite_difference(z, loss, 1e-6);
  std::vector<double> g = z, losses(N);
  host::crossentropy_forward_backward(losses.data(), g.data(), y.data(), N, V, Vp, scale);
  EXPECT_TRUE(all_close(g, want, 1e-8, 1e-6));
  EXPECT_TRUE(all_close(losses, naive_losses(z, y), 1e-12, 1e-12));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = V; i < Vp; ++i) EXPECT_EQ(g[n * Vp + i], 0.0);
}

}  // namespace
}  // namespace mpiformer::test
