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
  Backward,
  SendGradient,    // to the previous stage
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
std::vector<Action> pipeline_schedule(ScheduleKind kind, int num_stages, int stage, int num_micro);

// Forward-only pass (evaluation): receive, forward, send, per micro-batch.
std::vector<Action> forward_only_schedule(int num_stages, int stage, int num_micro);

// Most micro-batches whose activations a stage holds at once under `actions`
// (a forward opens one, its backward closes it): the size of the
// activation pool.
int max_live_activations(const std::vector<Action>& actions);

}  // namespace mpiformer
