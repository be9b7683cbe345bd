// `mpiformer plan` and `[parallel] auto`: every layout the deck's model
// allows on a number of ranks (dp x pp x tp, ZeRO stage, recomputation,
// micro-batch, schedule, a Mixture of Experts' ep; global_batch stays the
// deck's), each predicted (step_prediction.hpp), those that do not fit
// dropped, the rest ranked by tokens/s.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "plan/step_prediction.hpp"

namespace mpiformer {

struct Plan {
  int ranks = 0;
  int considered = 0;               // layouts predicted
  int fit = 0;                      // layouts that fit
  int timed = 0;                    // of which simulated (PlanOptions::keep)
  std::vector<Prediction> fitting;  // of which those timed, fastest first; without their timelines (step.timeline)
  Prediction leanest;               // the smallest memory_max of all (for the refusal)
};

struct PlanOptions {
  int threads = 1;  // layouts priced at once
  // The fastest `keep` layouts that fit are all that `fitting` holds (0:
  // every one that fits). A layout that cannot beat the slowest of the
  // fastest `keep` priced so far, even without waiting, is not simulated
  // (step_time_floor): most of a large search's layouts.
  int keep = 0;
  // Told every `report_every` while the search runs: layouts priced, of
  // how many, seconds so far, and the fastest that fits so far (null while
  // none does). A search over tens of thousands of ranks takes a while.
  std::function<void(int done, int total, double seconds, const Prediction* best)> progress;
  std::chrono::duration<double> report_every{5.0};
};

// Throws InputError naming the deck if no layout is valid on `ranks` at
// all (a global batch no data-parallel width divides, ...), or the
// machine file's rates are of another precision. The result does not
// depend on options.threads.
Plan plan_layouts(const Deck& deck, const MachineSpec& machine, int ranks, int ranks_per_node = 0,
                  const PlanOptions& options = {});

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
