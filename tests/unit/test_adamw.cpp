// AdamW against the update written out from the paper (decoupled decay,
// bias correction), two steps so the moments carry over; and the squared
// norm against a plain loop.
#include "host/adamw.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

TEST(AdamW, TwoStepsMatchTheFormula) {
  const int64_t n = 50;
  auto p = random_vector(n, 51), g1 = random_vector(n, 52), g2 = random_vector(n, 53);
  std::vector<double> m(n, 0), v(n, 0);
  std::vector<double> pw = p, mw(n, 0), vw(n, 0);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, clip = 0.5;
  for (int step = 1; step <= 2; ++step) {
    const auto& g = step == 1 ? g1 : g2;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * clip;
      mw[i] = b1 * mw[i] + (1 - b1) * gi;
      vw[i] = b2 * vw[i] + (1 - b2) * gi * gi;
      const double mh = mw[i] / (1 - std::pow(b1, step)), vh = vw[i] / (1 - std::pow(b2, step));
      pw[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * pw[i]);
    }
    host::adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                       host::AdamWParams{lr, b1, b2, eps, wd, step, clip});
  }
  EXPECT_TRUE(all_close(p, pw, 1e-14, 1e-12));
  EXPECT_TRUE(all_close(m, mw, 1e-14, 1e-12));
  EXPECT_TRUE(all_close(v, vw, 1e-14, 1e-12));
}

// A stage's chunk list: decay only where flagged, and elements between
// chunks (wte's padding) untouched.
TEST(AdamW, ChunkListDecaysByFlagAndSkipsGaps) {
  const int64_t n1 = 20000, gap = 30, n2 = 70, n = n1 + gap + n2;
  auto p = random_vector(n, 61), g = random_vector(n, 62);
  std::vector<double> m(n, 0), v(n, 0);
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, 0, n1, true);
  append_adamw_chunks(chunks, n1 + gap, n2, false);
  ASSERT_EQ(chunks.size(), 3u);  // n1 is longer than one chunk
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<double> want = p;
  for (int64_t i = 0; i < n; ++i) {
    if (i >= n1 && i < n1 + gap) continue;
    const double decay = i < n1 ? wd : 0.0;
    const double mh = (1 - b1) * g[i] / (1 - b1), vh = (1 - b2) * g[i] * g[i] / (1 - b2);
    want[i] -= lr * (mh / (std::sqrt(vh) + eps) + decay * want[i]);
  }
  host::adamw_update_chunks(p.data(), g.data(), m.data(), v.data(), chunks.data(),
                            static_cast<int64_t>(chunks.size()),
                            AdamWParams{lr, b1, b2, eps, wd, 1, 1.0});
  EXPECT_TRUE(all_close(p, want, 1e-14, 1e-12));
}

TEST(AdamW, SumOfSquares) {
  const auto x = random_vector(1000, 54);
  double want = 0;
  for (double e : x) want += e * e;
  EXPECT_NEAR(host::sum_of_squares(x.data(), 1000), want, 1e-10 * want);
}

}  // namespace
}  // namespace mpiformer::test
