// Causal multi-head attention: forward against naive per-head loops
// (explicit masked softmax), backward against central finite differences
// through that naive forward.
#include "host/attention.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

constexpr int64_t B = 2, T = 5, C = 12, NH = 3, HS = C / NH;

std::vector<double> naive_attention(const std::vector<double>& qkv) {
  std::vector<double> out(B * T * C, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        auto at = [&](int64_t tt, int64_t part, int64_t i) {
          return qkv[(b * T + tt) * 3 * C + part * C + h * HS + i];
        };
        std::vector<double> score(t + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double s = 0;
          for (int64_t i = 0; i < HS; ++i) s += at(t, 0, i) * at(j, 1, i);
          score[j] = s / std::sqrt(static_cast<double>(HS));
          mx = std::max(mx, score[j]);
        }
        double z = 0;
        for (auto& s : score) z += (s = std::exp(s - mx));
        for (int64_t i = 0; i < HS; ++i) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j) o += score[j] / z * at(j, 2, i);
          out[(b * T + t) * C + h * HS + i] = o;
        }
      }
  return out;
}

TEST(Attention, ForwardMatchesNaiveLoops) {
  const auto qkv = random_vector(B * T * 3 * C, 21);
  const auto want = naive_attention(qkv);
  std::vector<double> out(B * T * C, -5), att(B * NH * T * T, -5);
  host::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  EXPECT_TRUE(all_close(out, want, 1e-12, 1e-12));
  // Probabilities: rows sum to one, nothing above the diagonal.
  for (int64_t row = 0; row < B * NH * T; ++row) {
    const int64_t t = row % T;
    double s = 0;
    for (int64_t j = 0; j < T; ++j) {
      if (j > t) {
        EXPECT_EQ(att[row * T + j], 0.0);
      }
      s += att[row * T + j];
    }
    EXPECT_NEAR(s, 1.0, 1e-12);
  }
  auto qkvf = cast<float>(qkv);
  std::vector<float> outf(B * T * C), attf(B * NH * T * T);
  host::attention_forward(outf.data(), attf.data(), qkvf.data(), B, T, C, NH);
  EXPECT_TRUE(all_close(outf, want, 1e-5, 1e-4));
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  auto qkv = random_vector(B * T * 3 * C, 22);
  const auto r = random_vector(B * T * C, 23);
  const auto want = finite_difference(qkv, [&] { return dot(naive_attention(qkv), r); }, 1e-6);
  std::vector<double> out(B * T * C), att(B * NH * T * T), datt(B * NH * T * T);
  std::vector<double> dqkv(B * T * 3 * C, 42.0);  // overwritten, so garbage must vanish
  host::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  host::attention_backward(dqkv.data(), datt.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  EXPECT_TRUE(all_close(dqkv, want, 1e-7, 1e-6));
}

}  // namespace
}  // namespace mpiformer::test
