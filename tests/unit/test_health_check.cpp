// The start-up health check's verdict on measured figures, against cases
// worked out by hand: a slow GEMM names its rank; a rank is named for its
// links only when both are slow; one slow link names neither end (with
// two ranks there is one link, which can never fall below its own median).
#include <gtest/gtest.h>

#include "train/health_check.hpp"

namespace mpiformer::test {
namespace {

std::vector<RankHealth> ranks_of(const std::vector<double>& gemm) {
  std::vector<RankHealth> r;
  for (size_t i = 0; i < gemm.size(); ++i) {
    RankHealth h;
    h.rank = static_cast<int>(i);
    h.host = "node" + std::to_string(i / 2);  // two ranks a node
    h.gemm_flops = gemm[i];
    r.push_back(h);
  }
  return r;
}

std::vector<LinkHealth> ring(const std::vector<double>& gbs) {
  std::vector<LinkHealth> l;
  const int n = gbs.size() == 1 ? 2 : static_cast<int>(gbs.size());
  for (size_t i = 0; i < gbs.size(); ++i)
    l.push_back({static_cast<int>(i), (static_cast<int>(i) + 1) % n, gbs[i] * 1e9});
  return l;
}

TEST(HealthCheck, TwoRanksOneLinkNeverBlamesALink) {
  const HealthVerdict v = judge_health(ranks_of({75e9, 74e9}), ring({0.5}), 0.8);
  EXPECT_TRUE(v.below.empty());
  EXPECT_TRUE(v.slow_links.empty());
  EXPECT_NEAR(v.median_link, 0.5e9, 1);
  EXPECT_NE(v.line.find("1 link(s) 0.50-0.50 GB/s"), std::string::npos) << v.line;
  EXPECT_NE(v.line.find("every rank within 0.80"), std::string::npos) << v.line;
}

TEST(HealthCheck, SlowGemmNamesItsRankAndHost) {
  const HealthVerdict v = judge_health(ranks_of({75e9, 40e9}), ring({0.6}), 0.8);
  // Median of two = their mean, 57.5: 40 is 0.70 of it.
  ASSERT_EQ(v.below.size(), 1u);
  EXPECT_EQ(v.below[0], "rank 1 on node0: GEMM 40.0 GFLOP/s, 0.70 of the median");
  EXPECT_EQ(v.hosts, std::vector<std::string>{"node0"});
}

TEST(HealthCheck, BothLinksSlowNameTheRankTheyShare) {
  // Ring of 6: links 2 (ranks 2-3) and 3 (ranks 3-4) slow; rank 3 is common.
  const HealthVerdict v = judge_health(ranks_of({1, 1, 1, 1, 1, 1}), ring({2, 2, 0.5, 0.6, 2, 2}), 0.8);
  ASSERT_EQ(v.below.size(), 1u) << v.line;
  EXPECT_EQ(v.below[0], "rank 3 on node1: links to ranks 2 and 4 0.50 and 0.60 GB/s, 0.25 and 0.30 of the median");
  EXPECT_EQ(v.below_host, std::vector<std::string>{"node1"});
  EXPECT_TRUE(v.slow_links.empty()) << "the slow links are explained by the rank named";
  EXPECT_NE(v.json.find("\"below\": [{\"rank\": 3"), std::string::npos) << v.json;
}

TEST(HealthCheck, OneSlowLinkNamesNeitherEnd) {
  const HealthVerdict v = judge_health(ranks_of({1, 1, 1, 1}), ring({2, 0.4, 2, 2}), 0.8);
  EXPECT_TRUE(v.below.empty());
  EXPECT_TRUE(v.hosts.empty());
  ASSERT_EQ(v.slow_links.size(), 1u);
  EXPECT_EQ(v.slow_links[0], "link between rank 1 on node0 and rank 2 on node1 0.40 GB/s, 0.20 of the median");
  EXPECT_NE(v.json.find("\"slow_links\": [{\"ranks\": [1, 2], \"gbs\": 0.4}]"), std::string::npos) << v.json;
}

TEST(HealthCheck, TheClosingLinkOfTheRingCounts) {
  // Links 4 (ranks 4-0) and 0 (ranks 0-1) slow: rank 0.
  const HealthVerdict v = judge_health(ranks_of({1, 1, 1, 1, 1}), ring({0.3, 2, 2, 2, 0.3}), 0.8);
  ASSERT_EQ(v.below.size(), 1u);
  EXPECT_EQ(v.below[0].rfind("rank 0 on node0: links to ranks 4 and 1", 0), 0u) << v.below[0];
}

TEST(HealthCheck, OneRankHasNoLinks) {
  const HealthVerdict v = judge_health(ranks_of({5e9}), {}, 0.8);
  EXPECT_TRUE(v.below.empty());
  EXPECT_EQ(v.line.find("link"), std::string::npos) << v.line;
}

}  // namespace
}  // namespace mpiformer::test
