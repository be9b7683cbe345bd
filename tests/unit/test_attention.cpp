// Causal multi-head attention: forward against naive per-head loops
// (explicit masked softmax), backward against central finite differences
// through that naive forward. Two shapes: a short sequence (one causal
// block) and one of several blocks that do not tile it evenly, so every
// block product of host::head_gemm (kCausalBlock rows) is exercised; the
// matrices above the diagonal start as NaN there, so reading any entry
// the products skip would show. Grouped-query shapes (fewer kv heads than
// query heads, down to one) check the kv head each query head reads and
// the sum of a group's gradients into its kv head.
#include <limits>

#include "host/attention.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

struct Shape {
  int64_t B, T, C, NH, NKV;
  int64_t K() const { return NKV * (C / NH); }  // kv channels
  int64_t width() const { return C + 2 * K(); }
};
const Shape kShort{2, 5, 12, 3, 3};
const Shape kBlocks{1, 2 * host::kCausalBlock + 3, 8, 2, 2};
const Shape kGrouped{2, 7, 16, 4, 2};
const Shape kMultiQuery{1, 6, 12, 3, 1};

std::vector<double> naive_attention(const Shape& shape, const std::vector<double>& qkv) {
  const int64_t B = shape.B, T = shape.T, C = shape.C, NH = shape.NH, HS = C / NH;
  const int64_t W = shape.width(), K = shape.K(), g = NH / shape.NKV;
  std::vector<double> out(B * T * C, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t) {
        // part 0: query head h; 1, 2: key and value of kv head h / g.
        auto at = [&](int64_t tt, int64_t part, int64_t i) {
          const int64_t first = part == 0 ? h * HS : C + (part - 1) * K + h / g * HS;
          return qkv[(b * T + tt) * W + first + i];
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

void check_forward(const Shape& s, double fill) {
  const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH, NKV = s.NKV;
  const auto qkv = random_vector(B * T * s.width(), 21);
  const auto want = naive_attention(s, qkv);
  std::vector<double> out(B * T * C, -5), att(B * NH * T * T, fill);
  host::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NKV);
  EXPECT_TRUE(all_close(out, want, 1e-12, 1e-12));
  // Probabilities: rows sum to one, nothing above the diagonal.
  for (int64_t row = 0; row < B * NH * T; ++row) {
    const int64_t t = row % T;
    double sum = 0;
    for (int64_t j = 0; j < T; ++j) {
      if (j > t) {
        EXPECT_EQ(att[row * T + j], 0.0);
      }
      sum += att[row * T + j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
  auto qkvf = cast<float>(qkv);
  std::vector<float> outf(B * T * C), attf(B * NH * T * T, static_cast<float>(fill));
  host::attention_forward(outf.data(), attf.data(), qkvf.data(), B, T, C, NH, NKV);
  EXPECT_TRUE(all_close(outf, want, 1e-5, 1e-4));
}

void check_backward(const Shape& s, double fill) {
  const int64_t B = s.B, T = s.T, C = s.C, NH = s.NH, NKV = s.NKV;
  auto qkv = random_vector(B * T * s.width(), 22);
  const auto r = random_vector(B * T * C, 23);
  const auto want = finite_difference(qkv, [&] { return dot(naive_attention(s, qkv), r); }, 1e-6);
  std::vector<double> out(B * T * C), att(B * NH * T * T, fill), datt(B * NH * T * T, fill);
  std::vector<double> dqkv(B * T * s.width(), 42.0);  // overwritten, so garbage must vanish
  host::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NKV);
  host::attention_backward(dqkv.data(), datt.data(), r.data(), qkv.data(), att.data(), B, T, C, NH, NKV);
  EXPECT_TRUE(all_close(dqkv, want, 1e-7, 1e-6));
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(Attention, ForwardMatchesNaiveLoops) { check_forward(kShort, -5.0); }
TEST(Attention, BackwardMatchesFiniteDifferences) { check_backward(kShort, 0.0); }
TEST(Attention, GroupedQueryMatchesNaiveLoopsAndFiniteDifferences) {
  for (const Shape& s : {kGrouped, kMultiQuery}) {
    check_forward(s, -5.0);
    check_backward(s, 0.0);
  }
}
TEST(Attention, CausalBlocksMatchNaiveLoops) {
  check_forward(kBlocks, kNaN);
  check_backward(kBlocks, kNaN);
}

}  // namespace
}  // namespace mpiformer::test
