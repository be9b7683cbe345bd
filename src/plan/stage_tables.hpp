// What the planner derives from one stage's parameters, built once and
// shared: the parameter table, where its tensors sit, and how ZeRO cuts
// them over the stage's replicas. A layout search prices tens of
// thousands of layouts, and those that differ only in ZeRO stage,
// recomputation, micro-batch or schedule have the same stages: building
// these anew for each was most of a 1,536-rank search's time.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>

#include "core/gpt_config.hpp"
#include "model/parameter_table.hpp"
#include "model/shard_plan.hpp"
#include "model/stage_layout.hpp"

namespace mpiformer {

struct StageTables {
  ParameterTable table;
  StageLayout layout;
  StageTables(const GptConfig& cfg, const StageRange& range, int64_t replicas, int64_t ep);
  // ZeRO's cuts over `replicas` of `ep` expert groups, as rank 0 (its
  // largest part); throws ShardPlan's std::invalid_argument where ep does
  // not divide the replicas (a zero 0 layout asks for none).
  const ShardPlan& shards() const;
  double bytes() const;  // about what it holds (the table's entries, the cuts)

 private:
  int64_t replicas_, ep_;
  std::optional<ShardPlan> shards_;
};

// The tables of (cfg, range) cut over `replicas` (ep dividing it),
// remembered (the most recent few hundred, 256 MB at most; safe from
// several threads).
std::shared_ptr<const StageTables> stage_tables(const GptConfig& cfg, const StageRange& range,
                                                int64_t replicas, int64_t ep);

}  // namespace mpiformer
