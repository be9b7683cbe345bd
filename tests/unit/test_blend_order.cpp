// The blend's sample stream: exact shares at every prefix, one source per
// sample, a pure function of the position (walking, seeking and restoring
// agree), against counts recomputed here from the drawn sequence alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "train/blend_order.hpp"

namespace mpiformer {
namespace {

// Draws `n` samples and checks after each one that every source is within
// one sample of its share (the claim; Tijdeman's bound is tighter, and
// reported), and that the draw's index is the source's own count so far.
double max_deviation(const std::vector<double>& w, int64_t n) {
  BlendOrder order(w);
  double total = 0;
  for (double x : w) total += x;
  std::vector<int64_t> seen(w.size(), 0);
  double worst = 0;
  for (int64_t t = 1; t <= n; ++t) {
    const BlendOrder::Draw d = order.next();
    EXPECT_EQ(d.index, seen[static_cast<size_t>(d.source)]);
    ++seen[static_cast<size_t>(d.source)];
    for (size_t i = 0; i < w.size(); ++i) {
      const double off = std::fabs(static_cast<double>(seen[i]) - w[i] / total * static_cast<double>(t));
      worst = std::max(worst, off);
    }
  }
  return worst;
}

TEST(BlendOrder, EverySourceStaysWithinOneSampleOfItsShare) {
  // Weights a user writes (0.7/0.2/0.1), equal ones (ties), a tiny source
  // beside a huge one, and random blends of 2 to 12 sources.
  EXPECT_LT(max_deviation({0.7, 0.2, 0.1}, 100000), 1.0);
  EXPECT_LT(max_deviation({1, 1, 1, 1}, 20000), 1.0);
  EXPECT_LT(max_deviation({0.999, 0.001}, 50000), 1.0);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.01, 1.0);
  for (int k = 2; k <= 12; ++k) {
    std::vector<double> w(static_cast<size_t>(k));
    for (double& x : w) x = u(rng) * u(rng);
    const double dev = max_deviation(w, 30000);
    // Tijdeman's bound: 1 - 1/(2k - 2).
    EXPECT_LE(dev, 1.0 - 1.0 / (2.0 * k - 2.0) + 1e-9) << k << " sources";
  }
}

TEST(BlendOrder, OneSourceTakesEverySample) {
  BlendOrder order({3.0});
  for (int64_t t = 0; t < 100; ++t) {
    const BlendOrder::Draw d = order.next();
    EXPECT_EQ(d.source, 0);
    EXPECT_EQ(d.index, t);
  }
}

TEST(BlendOrder, SeekAndRestoreGiveTheWalkedStream) {
  const std::vector<double> w = {0.5, 0.3, 0.15, 0.05};
  BlendOrder walked(w);
  for (int i = 0; i < 12345; ++i) walked.next();
  BlendOrder sought(w);
  sought.seek(12345);
  EXPECT_EQ(sought.counts(), walked.counts());
  BlendOrder restored(w);
  EXPECT_EQ(restored.restore(12345, walked.counts()), "");
  for (int i = 0; i < 1000; ++i) {
    const auto a = walked.next(), b = restored.next();
    ASSERT_EQ(a.source, b.source);
    ASSERT_EQ(a.index, b.index);
  }
  // A state the blend can never be in is refused, not followed.
  std::vector<int64_t> bad = walked.counts();
  bad[0] += 5;
  bad[1] -= 5;
  EXPECT_NE(restored.restore(walked.position(), bad), "");
  bad = walked.counts();
  bad[3] += 1;
  EXPECT_NE(restored.restore(walked.position(), bad), "");
}

TEST(BlendOrder, AReblendCarriesEachSourcesPositionOn) {
  // From sample 1000 the weights change; each source goes on from its own
  // count (its epochs continue) and the new shares hold from there.
  BlendOrder before({0.5, 0.5});
  before.seek(1000);
  BlendOrder after({0.9, 0.1}, 1000, before.counts());
  std::vector<int64_t> given(2, 0);
  for (int t = 1; t <= 5000; ++t) {
    const auto d = after.next();
    EXPECT_EQ(d.index, before.counts()[static_cast<size_t>(d.source)] + given[static_cast<size_t>(d.source)]);
    ++given[static_cast<size_t>(d.source)];
    EXPECT_LT(std::fabs(given[0] - 0.9 * t), 1.0);
  }
}

}  // namespace
}  // namespace mpiformer
