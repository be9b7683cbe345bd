// Pipeline schedules as data: for one stage, the ordered list of what it
// does in one optimizer step. The trainer walks the list; the tests check
// the list (order, memory, deadlock freedom) without running a model.
#pragma once
#include <string>
#include <vector>

#include "core/settings.hpp"

namespace mpiformer {


enum class Op {
  RecvActivation,  // from the previous stage
  Forward,
  SendActivation,  // to the next stage
  RecvGradient,    // from the next stage
  Backward,        // the whole backward, or (zero-bubble schedules) its input-gradient half B
  SendGradient,    // to the previous stage
  WeightGradients, // zero-bubble schedules: the weight-gradient half W, deferred
  ReduceGradients, // across the data-parallel group (and the tied embedding)
  OptimizerStep,
};
const char* op_name(Op op);

struct Action {
  Op op;
  int micro = -1;  // micro-batch index, -1 for whole-step actions
  bool operator==(const Action& o) const { return op == o.op && micro == o.micro; }
};

// One step of `kind` for `stage` of `num_stages`, over `num_micro`
// micro-batches. The first stage never receives activations, the last never
// sends them; sends are non-blocking, receives block.
//  - gpipe: every forward, then every backward;
//  - 1f1b: warm-up of (num_stages - stage - 1) forwards, then one forward
//    one backward, then the remaining backwards (Megatron's order).
//  - zb-h1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
//    1F1B's order of forwards and backwards, each backward split into B
//    (the input gradient, which the previous stage waits for) and W (the
//    weight gradients, which nobody waits for). Stage s runs a
//    micro-batch's W s micro-batches after its B, so the W's it owes fill
//    the end of the step, where 1F1B leaves stage s idle for s backwards.
//    Every stage holds at most num_stages micro-batches (stage 0's 1F1B
//    peak): with F, B and W of equal times the bubble falls from 1F1B's
//    (p - 1)(F + B + W) to (p - 1)(F + B - W), a third.
std::vector<Action> pipeline_schedule(ScheduleKind kind, int num_stages, int stage, int num_micro);

// Forward-only pass (evaluation): receive, forward, send, per micro-batch.
std::vector<Action> forward_only_schedule(int num_stages, int stage, int num_micro);

// Most micro-batches whose activations a stage holds at once under `actions`
// (a forward opens one; its backward closes it, or its W where the
// schedule splits the backward: W reads what the forward kept): the size
// of the activation pool.
int max_live_activations(const std::vector<Action>& actions);

}  // namespace mpiformer
