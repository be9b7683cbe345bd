// A stage's Mixture-of-Experts sizes, worked out once for the stage that
// allocates its buffers (gpt_stage_impl.hpp) and the footprint that
// predicts them (stage_footprint.cpp): the router's shape for one
// micro-batch, the most rows its experts can be dispatched, and which of a
// slot's block positions hold a sparse block (under interleaving a slot's
// position j serves block j of every chunk, some sparse, some dense).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/moe_routing.hpp"
#include "core/gpt_config.hpp"
#include "model/parameter_table.hpp"

namespace mpiformer {

struct MoePlan {
  RouterShape router;  // one micro-batch's B*T tokens (T: this rank's of each sequence)
  // Dispatched rows at most: every assignment, or each expert's capacity
  // in each sequence where that is fewer.
  int64_t rows = 0;
  // Expert parallelism over `ep` ranks: the experts this rank holds, and
  // the most rows they can receive from the group's micro-batches (each
  // token sends a rank at most min(k, local experts) of its assignments;
  // each local expert takes at most its capacity of each sequence). At
  // ep 1: rows.
  int64_t ep = 1, local_experts = 0, received = 0;
  std::vector<bool> sparse_at, dense_at;  // per slot position
  bool any_sparse = false;
};

// `cp`: the context-parallel ranks each sequence is split over (the
// router's capacity is the whole sequence's; a rank may be given all of
// an expert's places of a sequence).
inline MoePlan moe_plan(const GptConfig& cfg, const StageRange& range, int64_t micro_batch,
                        int64_t cp = 1) {
  MoePlan p;
  const int64_t T = cfg.seq_len / cp, BT = micro_batch * T, L = range.full_chunk();
  p.sparse_at.assign(static_cast<size_t>(L), false);
  p.dense_at.assign(static_cast<size_t>(L), false);
  for (int64_t i = 0; i < range.num_layers(); ++i) {
    const bool sparse = cfg.moe_layer(range.layer(i));
    (sparse ? p.sparse_at : p.dense_at)[static_cast<size_t>(range.slot_position(i))] = true;
    p.any_sparse = p.any_sparse || sparse;
  }
  if (!cfg.moe()) return p;
  p.router = {BT, T, cfg.experts, cfg.top_k, cfg.expert_capacity(cfg.seq_len)};
  p.router.context = cp;
  p.rows = BT * cfg.top_k;
  if (p.router.capacity > 0) p.rows = std::min(p.rows, cfg.experts * micro_batch * p.router.capacity);
  p.ep = range.ep;
  p.local_experts = cfg.experts / range.ep;
  p.received = p.rows;
  if (p.ep > 1) {
    p.received = p.ep * BT * std::min(cfg.top_k, p.local_experts);
    if (p.router.capacity > 0)
      p.received = std::min(p.received, p.ep * p.local_experts * micro_batch * p.router.capacity);
  }
  return p;
}

}  // namespace mpiformer
