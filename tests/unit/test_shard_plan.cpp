// ZeRO's plan: over every rank of a group, the parts of each unit tile the
// stage's buffer exactly once, cut at tensor rows; every logical element
// of every tensor is owned by exactly one rank and updated by exactly one
// AdamW chunk there; shard sizes are as even as rows allow; the tied wte
// is cut alike on the first and last stage.
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

void check_tiling(const GptConfig& cfg, const StageRange& range, int dp) {
  const ParameterTable table(cfg, range);
  const StageLayout layout(table, range);
  std::vector<int> owners(static_cast<size_t>(table.total_storage()), 0);
  std::vector<int> updated(static_cast<size_t>(table.total_storage()), 0);
  int64_t largest = 0, smallest = table.total_storage();
  for (int r = 0; r < dp; ++r) {
    const ShardPlan plan(table, layout, dp, r);
    int64_t at = 0;
    for (const auto& u : plan.units()) {
      ASSERT_EQ(u.shard_offset, at);
      for (int64_t i = plan.part_begin(u); i < plan.part_begin(u) + plan.part_size(u); ++i)
        owners[i]++;
      at += plan.part_size(u);
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
          updated[flat]++;
          ASSERT_EQ(covered[p.shard_offset + (row - p.row_begin) * rl + k], 1) << s.name;
        }
    }
  }
  for (int o : owners) ASSERT_EQ(o, 1);
  for (const auto& s : table.specs())
    for (int64_t i = s.offset; i < s.offset + s.numel(); ++i) ASSERT_EQ(updated[i], 1) << s.name;
  // As even as rows allow: the widest row is wte's (n_embd elements), and
  // each of a rank's units can be off by at most one row.
  const ShardPlan any(table, layout, dp, 0);
  EXPECT_LE(largest - smallest, static_cast<int64_t>(any.units().size()) * cfg.n_embd * 4);
  EXPECT_EQ(any.max_shard_size(), largest);
}

TEST(ShardPlan, PartsTileTheStageOnceAtRowBoundaries) {
  const GptConfig cfg = config();
  for (int pp : {1, 2})
    for (int s = 0; s < pp; ++s)
      for (int dp : {1, 2, 3, 4, 7}) check_tiling(cfg, partition_stage(cfg, s, pp), dp);
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

}  // namespace
}  // namespace mpiformer::test
