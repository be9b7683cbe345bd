// The Mixture-of-Experts router (host/moe_router.hpp) against a router
// written here with sorts and plain loops: its choices, ties, gates,
// capacity drops, dispatch rows and losses; its gradient against central
// finite differences of that router's loss. Dispatch and combine
// (host/moe_dispatch.hpp) against plain loops and finite differences.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "host/moe_dispatch.hpp"
#include "host/moe_router.hpp"
#include "moe_reference.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

struct Routed {
  std::vector<double> probs, lse, gate;
  std::vector<int32_t> expert, dest, chose;
  std::vector<int64_t> kept;
  double totals[kRouterTotals] = {};
};

Routed route(const RouterShape& r, const std::vector<double>& logits) {
  Routed o;
  const size_t N = static_cast<size_t>(r.tokens), E = static_cast<size_t>(r.experts),
               K = static_cast<size_t>(r.top_k);
  o.probs.resize(N * E);
  o.lse.resize(N);
  o.gate.resize(N * K);
  o.expert.resize(N * K);
  o.dest.resize(N * K);
  o.chose.resize(N / static_cast<size_t>(r.seq_len) * E);
  o.kept.resize(E);
  std::vector<int64_t> scratch(host::router_scratch_bytes(r) / sizeof(int64_t));
  host::router_forward(r, logits.data(), o.probs.data(), o.lse.data(), o.expert.data(),
                       o.gate.data(), o.dest.data(), o.chose.data(), o.kept.data(), o.totals,
                       scratch.data());
  return o;
}

// 2 sequences of 5 tokens, 4 experts, top 2, capacity 2 (= 1.0 x 5 x 2 / 4
// rounded down): several experts overflow.
TEST(MoeRouter, ChoosesGatesDropsAndDispatchesAsDefined) {
  const int64_t T = 5, S = 2, N = S * T, E = 4, K = 2, cap = 2;
  std::vector<double> logits = random_vector(static_cast<size_t>(N * E), 71, 2.0);
  // A tie: token 3's experts 1 and 2 equal and largest; the lower wins.
  logits[3 * E + 1] = logits[3 * E + 2] = 5.0;
  // Sequence 1 leans on expert 0, which must drop.
  for (int64_t t = 0; t < T; ++t) logits[(T + t) * E + 0] = 4.0 + 0.1 * static_cast<double>(t);
  const RouterShape r{N, T, E, K, cap};
  const Routed got = route(r, logits);
  const Naive want = naive_route(logits, N, T, E, K, cap);
  EXPECT_EQ(got.expert[3 * K], 1);
  EXPECT_EQ(got.expert[3 * K + 1], 2);
  std::vector<int64_t> kept(static_cast<size_t>(E), 0);
  int64_t dropped = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < K; ++j) {
      const size_t a = static_cast<size_t>(n * K + j);
      EXPECT_EQ(got.expert[a], want.chosen[n][j]) << n << "," << j;
      EXPECT_NEAR(got.gate[a], want.gate[n][j], 1e-15);
      EXPECT_EQ(got.dest[a] < 0, want.dropped[n][j]) << n << "," << j;
      if (want.dropped[n][j]) ++dropped;
      else ++kept[want.chosen[n][j]];
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(got.totals[kDropped], static_cast<double>(dropped));
  EXPECT_EQ(got.kept, kept);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t e = 0; e < E; ++e) EXPECT_EQ(got.chose[s * E + e], want.chose[s][e]);
  EXPECT_NEAR(got.totals[kAuxSum], want.aux, 1e-13);
  EXPECT_NEAR(got.totals[kZSum], want.z, 1e-12);
  // The rows: each expert's block in expert order, inside it sequence 0's
  // then sequence 1's, each in the order taken (first choices by position,
  // then second choices); every row used once.
  std::vector<int32_t> rows;
  int64_t offset = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < S; ++s)
      for (int64_t j = 0; j < K; ++j)
        for (int64_t t = 0; t < T; ++t) {
          const size_t a = static_cast<size_t>((s * T + t) * K + j);
          if (got.expert[a] == e && got.dest[a] >= 0) rows.push_back(got.dest[a]);
        }
    offset += kept[static_cast<size_t>(e)];
    EXPECT_EQ(static_cast<int64_t>(rows.size()), offset);
  }
  std::vector<int32_t> in_order(rows.size());
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_EQ(rows, in_order);
  // Without a capacity nothing drops.
  const Routed all = route(RouterShape{N, T, E, K, 0}, logits);
  EXPECT_EQ(all.totals[kDropped], 0.0);
  EXPECT_EQ(std::accumulate(all.kept.begin(), all.kept.end(), int64_t{0}), N * K);
}

// A uniform router's aux loss is 1 per sequence (Switch's normalisation).
TEST(MoeRouter, UniformRoutingHasAuxLossOne) {
  const int64_t T = 8, E = 4, K = 1;
  std::vector<double> logits(static_cast<size_t>(T * E), 0.0);
  // Equal probabilities; choices spread evenly by nudging the argmax.
  for (int64_t t = 0; t < T; ++t) logits[t * E + t % E] = 1e-12;
  const Routed got = route(RouterShape{T, T, E, K, 0}, logits);
  EXPECT_NEAR(got.totals[kAuxSum], 1.0, 1e-9);
}

// d/dlogits of  sum_a w_a g_a (kept assignments) + alpha sum_s aux(s) +
// zeta sum_n z(n), with the routing fixed (the logits' gaps far larger
// than the step), against central differences of the naive router.
TEST(MoeRouter, GradientMatchesFiniteDifferences) {
  const int64_t T = 4, S = 3, N = S * T, E = 5, K = 2, cap = 2;
  std::vector<double> logits = random_vector(static_cast<size_t>(N * E), 72, 3.0);
  const std::vector<double> w = random_vector(static_cast<size_t>(N * K), 73);
  const double alpha = 0.7, zeta = 0.05;
  const RouterShape r{N, T, E, K, cap};
  const Routed got = route(r, logits);
  ASSERT_GT(got.totals[kDropped], 0.0);
  std::vector<double> dgate(static_cast<size_t>(N * K));
  for (size_t a = 0; a < dgate.size(); ++a) dgate[a] = got.dest[a] >= 0 ? w[a] : 0.0;
  std::vector<double> dl(static_cast<size_t>(N * E), 9.0);
  host::router_backward(r, dl.data(), dgate.data(), got.probs.data(), got.lse.data(),
                        got.expert.data(), got.gate.data(), got.chose.data(), alpha, zeta);
  const Naive at = naive_route(logits, N, T, E, K, cap);
  auto loss = [&] {
    const Naive x = naive_route(logits, N, T, E, K, cap);
    EXPECT_EQ(x.chosen, at.chosen);  // the step must not change the routing
    double s = alpha * x.aux + zeta * x.z;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j)
        if (!x.dropped[n][j]) s += w[static_cast<size_t>(n * K + j)] * x.gate[n][j];
    return s;
  };
  const auto want = finite_difference(logits, loss, 1e-6);
  EXPECT_TRUE(all_close(dl, want, 1e-8, 1e-6));
}

// Tokens to experts and back around a stand-in expert (out = tanh(buf)
// times a factor per row): 5 tokens, top 2, one assignment dropped and one
// token with both dropped; the rows permuted as a router numbers them.
TEST(MoeDispatch, RoundTripMatchesLoopsAndFiniteDifferences) {
  const int64_t N = 5, K = 2, C = 3;
  const std::vector<int32_t> dest = {3, 0, 5, -1, 1, 6, -1, -1, 2, 4};
  const int64_t M = 7;
  std::vector<double> x = random_vector(static_cast<size_t>(N * C), 81);
  std::vector<double> gate = random_vector(static_cast<size_t>(N * K), 82);
  const std::vector<double> w = random_vector(static_cast<size_t>(N * C), 83);
  auto expert = [](double v, int64_t m) { return std::tanh(v) * 0.1 * static_cast<double>(m + 1); };
  // The whole layer in plain loops: y[n] = sum of kept gate * expert(x[n]).
  auto layer = [&] {
    std::vector<double> y(static_cast<size_t>(N * C), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t d = dest[static_cast<size_t>(n * K + j)];
        if (d < 0) continue;
        for (int64_t c = 0; c < C; ++c)
          y[n * C + c] += gate[n * K + j] * expert(x[n * C + c], d);
      }
    return y;
  };
  std::vector<double> buf(static_cast<size_t>(M * C), 7.0), out(buf.size()), y(x.size(), 9.0);
  host::moe_dispatch_forward(buf.data(), x.data(), dest.data(), N, K, C);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) out[m * C + c] = expert(buf[m * C + c], m);
  host::moe_combine_forward(y.data(), out.data(), gate.data(), dest.data(), N, K, C);
  EXPECT_TRUE(all_close(y, layer(), 1e-15, 1e-15));
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(y[3 * C + c], 0.0);  // both dropped
  // Backward of  sum w . y.
  std::vector<double> dout(buf.size(), 0.0), dgate(gate.size(), 9.0), dbuf(buf.size(), 0.0);
  host::moe_combine_backward(dout.data(), dgate.data(), w.data(), out.data(), gate.data(),
                             dest.data(), N, K, C);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const double t = std::tanh(buf[m * C + c]);
      dbuf[m * C + c] = dout[m * C + c] * (1 - t * t) * 0.1 * static_cast<double>(m + 1);
    }
  std::vector<double> dx(x.size(), 0.5);  // accumulates
  host::moe_dispatch_backward(dx.data(), dbuf.data(), dest.data(), N, K, C);
  auto loss = [&] {
    const std::vector<double> v = layer();
    double s = 0;
    for (size_t i = 0; i < v.size(); ++i) s += w[i] * v[i];
    return s;
  };
  std::vector<double> want_dx = finite_difference(x, loss, 1e-6);
  for (double& v : want_dx) v += 0.5;
  EXPECT_TRUE(all_close(dx, want_dx, 1e-9, 1e-7));
  const std::vector<double> want_dgate = finite_difference(gate, loss, 1e-6);
  EXPECT_TRUE(all_close(dgate, want_dgate, 1e-9, 1e-7));
}

}  // namespace
}  // namespace mpiformer::test
