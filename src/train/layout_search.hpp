// `mpiformer plan` and `[parallel] auto`: every layout the deck's model
// allows on a number of ranks (dp x pp x tp, ZeRO stage, recomputation,
// micro-batch, schedule; global_batch stays the deck's), each predicted
// (step_prediction.hpp), those that do not fit dropped, the rest ranked by
// tokens/s.
#pragma once
#include <string>
#include <vector>

#include "train/step_prediction.hpp"

namespace mpiformer {

struct Plan {
  int ranks = 0;
  int considered = 0;               // layouts predicted
  std::vector<Prediction> fitting;  // fastest first
  Prediction leanest;               // the smallest memory_max of all (for the refusal)
};

// Throws InputError naming the deck if no layout is valid on `ranks` at
// all (a global batch no data-parallel width divides, ...).
Plan plan_layouts(const Deck& deck, const MachineSpec& machine, int ranks, int ranks_per_node = 0);

// [parallel] auto: the plan's fastest layout for `ranks` (ranks_per_node
// on each node), priced by [run] machine. InputError if the deck names no
// machine file or no layout fits (plan_refusal's message).
Prediction choose_layout(const Deck& deck, int ranks, int ranks_per_node, int* fitting);

// What a rank's memory is planned with: "of which X GiB are planned
// ([parallel] memory_margin ...)".
std::string margin_note(const Deck& deck, const Prediction& p);

// Why nothing fits: the leanest layout's need against what a rank has.
std::string plan_refusal(const Deck& deck, const MachineSpec& machine, const Plan& plan);

}  // namespace mpiformer
