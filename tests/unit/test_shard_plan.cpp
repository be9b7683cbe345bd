// ZeRO's plan: over every rank of a group, the parts of each unit tile the
// stage's buffer exactly once, cut at tensor rows; every logical element
// of every tensor is owned by exactly one rank and updated by exactly one
// AdamW chunk there; shard sizes are as even as rows allow; the tied wte
// is cut alike on the first and last stage. Under expert parallelism the
// ep ranks of a group hold different experts at the same offsets: each
// expert element is owned once among the dp / ep replicas holding it, and
// every dense one once over dp.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "model/shard_plan.hpp"

namespace mpiformer::test {
namespace {

GptConfig config() {
  GptConfig c;
  c.n_layer = 4;
  c.n_head = 3;
  c.n_embd = 24;
  c.seq_len = 7;
  c.vocab_size = 131;
  return c;
}

void check_tiling(const GptConfig& cfg, StageRange range, int dp, int ep = 1) {
  range.ep = ep;
  const ParameterTable table(cfg, range);
  const StageLayout layout(table, range);
  // Counted per expert group (ep_rank): the expert elements of one ep
  // rank's table (offsets alike on every ep rank), every dense one.
  std::vector<std::vector<int>> owners(static_cast<size_t>(ep),
                                       std::vector<int>(static_cast<size_t>(table.total_storage()), 0));
  std::vector<int> updated(static_cast<size_t>(table.total_storage()), 0);
  std::vector<bool> expert(static_cast<size_t>(table.total_storage()), false);
  int64_t largest = 0, smallest = table.total_storage();
  for (int r = 0; r < dp; ++r) {
    const ShardPlan plan(table, layout, dp, r, ep);
    int64_t at = 0;
    for (const auto& u : plan.units()) {
      ASSERT_EQ(u.shard_offset, at);
      ASSERT_EQ(plan.counts(u).size(), static_cast<size_t>(u.experts ? dp / ep : dp));
      for (int64_t i = plan.part_begin(u); i < plan.part_begin(u) + plan.part_size(u); ++i) {
        owners[static_cast<size_t>(u.experts ? r % ep : 0)][i]++;
        expert[i] = u.experts;
      }
      at += plan.part_size(u);
    }
    // A block's units are consecutive, its dense tensors' first.
    for (int64_t b = 0; b < static_cast<int64_t>(layout.layers.size()); ++b) {
      const auto [first, last] = plan.block_units(b);
      ASSERT_LT(first, last);
      EXPECT_EQ(plan.units()[first].begin, layout.layers[b][0]);
      EXPECT_EQ(plan.units()[last - 1].end, layout.block_stop(b));
      for (size_t k = first; k < last; ++k) EXPECT_EQ(plan.units()[k].block, b);
      EXPECT_EQ(last - first, ep > 1 && cfg.moe_layer(range.first_layer + b) ? 2u : 1u);
    }
    EXPECT_EQ(at, plan.shard_size());
    largest = std::max(largest, at);
    smallest = std::min(smallest, at);
    // Each tensor's owned rows map to shard offsets inside its unit's part,
    // and AdamW's chunks cover exactly them.
    std::vector<int> covered(static_cast<size_t>(plan.shard_size()), 0);
    for (const auto& c : plan.adamw_chunks(table))
      for (int64_t i = c.offset; i < c.offset + c.length; ++i) covered[i]++;
    for (const auto& s : table.specs()) {
      const TensorPart p = plan.part_of(s);
      const int64_t rl = s.numel() / s.shape[0];
      ASSERT_LE(p.row_end, s.shape[0]) << s.name;
      for (int64_t row = p.row_begin; row < p.row_end; ++row)
        for (int64_t k = 0; k < rl; ++k) {
          const int64_t flat = s.offset + row * rl + k;
          const ShardUnit& u = plan.unit_at(s.offset);
          ASSERT_EQ(p.shard_offset + (row - p.row_begin) * rl + k - u.shard_offset,
                    flat - plan.part_begin(u)) << s.name;
          if (!expert[flat] || r % ep == 0) updated[flat]++;
          ASSERT_EQ(covered[p.shard_offset + (row - p.row_begin) * rl + k], 1) << s.name;
        }
    }
  }
  for (size_t i = 0; i < updated.size(); ++i)
    for (int g = 0; g < ep; ++g) ASSERT_EQ(owners[g][i], expert[i] || g == 0 ? 1 : 0) << i;
  for (const auto& s : table.specs())
    for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) ASSERT_EQ(updated[i], 1) << s.name;
  // As even as rows allow: the widest row is wte's (n_embd elements), and
  // each of a rank's units can be off by at most one row.
  const ShardPlan any(table, layout, dp, 0, ep);
  EXPECT_LE(largest - smallest, static_cast<int64_t>(any.units().size()) * cfg.n_embd * 4);
  EXPECT_EQ(any.max_shard_size(), largest);
}

TEST(ShardPlan, PartsTileTheStageOnceAtRowBoundaries) {
  const GptConfig cfg = config();
  for (int pp : {1, 2})
    for (int s = 0; s < pp; ++s)
      for (int dp : {1, 2, 3, 4, 7}) check_tiling(cfg, partition_stage(cfg, s, pp), dp);
}

TEST(ShardPlan, ExpertsAreCutOverTheReplicasHoldingThem) {
  GptConfig cfg = config();
  cfg.experts = 4;
  cfg.moe_every = 2;  // sparse and dense blocks mixed
  for (int pp : {1, 2})
    for (int s = 0; s < pp; ++s)
      for (const auto& [dp, ep] : {std::pair{2, 2}, {4, 2}, {6, 2}, {4, 4}, {3, 1}})
        check_tiling(cfg, partition_stage(cfg, s, pp), dp, ep);
}

TEST(ShardPlan, TiedEmbeddingIsCutAlikeOnBothStages) {
  const GptConfig cfg = config();
  const StageRange first = partition_stage(cfg, 0, 2), last = partition_stage(cfg, 1, 2);
  const ParameterTable t0(cfg, first), t1(cfg, last);
  for (int dp : {2, 3}) {
    for (int r = 0; r < dp; ++r) {
      const ShardPlan p0(t0, StageLayout(t0, first), dp, r), p1(t1, StageLayout(t1, last), dp, r);
      EXPECT_EQ(p0.counts(p0.unit_at(t0.at("wte").offset)), p1.counts(p1.unit_at(t1.at("wte").offset)));
      EXPECT_EQ(p0.part_of(t0.at("wte")).row_begin, p1.part_of(t1.at("wte")).row_begin);
      EXPECT_EQ(p0.part_of(t0.at("wte")).row_end, p1.part_of(t1.at("wte")).row_end);
    }
  }
}

// ZeRO 3's vocabulary pieces (StageLayout::piece) move each rank's share
// of its own part. n_embd 8, vocabulary 11 padded to 128 rows: wte is
// 1024 floats against a 928-float block, so pieces of 112 rows (116 fit,
// cut to a multiple of 8) and 16: [0, 896) and [896, 1024) of wte. At dp 3
// the parts are cut at rows near thirds: [0, 344), [344, 688), [688,
// 1024). So piece 0's counts are 344, 344, 208 and piece 1's 0, 0, 128;
// rank 2's shares sit at the start of its part and 208 floats on.
TEST(ShardPlan, VocabularyPiecesCarryEachRanksShareOfItsPart) {
  GptConfig cfg;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  cfg.seq_len = 4;
  cfg.vocab_size = 11;
  const StageRange range = partition_stage(cfg, 0, 1);
  const ParameterTable table(cfg, range);
  const StageLayout layout(table, range);
  ASSERT_EQ(layout.block_storage(), 928);
  ASSERT_EQ(layout.vocab_pieces(StageLayout::kVocabIn), 2);
  const int64_t wte = table.at("wte").offset;
  const std::vector<std::vector<int64_t>> counts = {{344, 344, 208}, {0, 0, 128}};
  const std::vector<std::pair<int64_t, int64_t>> spans = {{0, 896}, {896, 1024}};
  for (int r = 0; r < 3; ++r) {
    const ShardPlan plan(table, layout, 3, r);
    const ShardUnit& u = plan.unit_at(wte);
    ASSERT_EQ(plan.part_begin(u) - wte, std::vector<int64_t>({0, 344, 688})[r]);
    // Both uses of the tied wte (pp 1) go in the same pieces.
    for (const int64_t use : {StageLayout::kVocabIn, StageLayout::kVocabOut}) {
      int64_t shard_at = u.shard_offset;
      for (int64_t k = 0; k < 2; ++k) {
        int calls = 0;
        plan.for_window(StageLayout::piece_id(use, k), [&](const WindowPart& p) {
          ++calls;
          EXPECT_EQ(p.begin - wte, spans[k].first);
          EXPECT_EQ(p.end - wte, spans[k].second);
          EXPECT_EQ(*p.counts, counts[k]);
          EXPECT_EQ(p.size, counts[k][r]);
          EXPECT_EQ(p.shard_offset, shard_at) << "rank " << r << ", piece " << k;
          if (p.size > 0) EXPECT_EQ(p.mine, std::max(plan.part_begin(u), p.begin));
          shard_at += p.size;
        });
        EXPECT_EQ(calls, 1);
      }
      EXPECT_EQ(shard_at, u.shard_offset + plan.part_size(u)) << "the pieces cover the part";
    }
  }
  // The receive buffers hold the most any rank has of a window: a piece's
  // 344 here, more than a block's (928 / 3, cut at rows).
  EXPECT_EQ(ShardPlan(table, layout, 3, 0).max_window_part(true), 344);
  EXPECT_LT(ShardPlan(table, layout, 3, 0).max_block_part(), 344);
}

}  // namespace
}  // namespace mpiformer::test
