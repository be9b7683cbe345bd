// Pipeline schedules as data: for one stage, the ordered list of what it
// does in one optimizer step. The trainer walks the list; the tests check
// the list (order, memory, deadlock freedom) without running a model.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/settings.hpp"
#include "core/slot_kinds.hpp"

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
  int chunk = 0;   // the rank's model chunk (interleaved; 0 otherwise)
  bool operator==(const Action& o) const {
    return op == o.op && micro == o.micro && chunk == o.chunk;
  }
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
//  - interleaved (Narayanan et al., SC'21; Megatron's order): each rank
//    holds `chunks` = v model chunks; chunk c of stage s is virtual stage
//    c p + s, so a micro-batch goes round the pipeline v times (the last
//    stage's chunk c sends to the first stage's chunk c + 1). Micro-batches
//    run in rounds of p (num_micro a multiple of p): a round's forwards
//    through chunk 0, then chunk 1, ...; its backwards from chunk v - 1
//    down. Warm-up: 2 (p - s - 1) + (v - 1) p chunk forwards, then one
//    forward one backward. Each chunk pass is 1/v of a stage's work, so
//    the bubble falls to (p - 1)(F + B) / v, for (1 + (p - 1) / (p v))
//    times 1F1B's activations on stage 0.
std::vector<Action> pipeline_schedule(ScheduleKind kind, int num_stages, int stage, int num_micro,
                                      int chunks = 1);

// Forward-only pass (evaluation): receive, forward, send, per micro-batch
// (and per chunk, in model order).
std::vector<Action> forward_only_schedule(int num_stages, int stage, int num_micro,
                                          int chunks = 1);

// Where a message goes: the pipeline rank and the chunk there. Activations
// go to the next virtual stage, gradients to the previous one; between
// chunks they wrap from the last stage to the first (and back).
struct PipePeer {
  int stage, chunk;
};
PipePeer activation_to(int num_stages, int stage, int chunk);
PipePeer gradient_to(int num_stages, int stage, int chunk);
// The stages a receive waits on (the wrap included).
int activation_from(int num_stages, int stage);
int gradient_from(int num_stages, int stage);
// Message tags, from the receiver's (micro-batch, chunk): a stage's
// messages in one direction never share one.
inline int activation_tag(int micro, int chunk, int chunks) { return 2 * (micro * chunks + chunk); }
inline int gradient_tag(int micro, int chunk, int chunks) {
  return 2 * (micro * chunks + chunk) + 1;
}
// Whether stage `stage`'s chunk `chunk` is the model's first (it embeds)
// or last (it holds the head and the loss).
inline bool first_virtual(int stage, int chunk) { return stage == 0 && chunk == 0; }
inline bool last_virtual(int num_stages, int stage, int chunk, int chunks) {
  return stage == num_stages - 1 && chunk == chunks - 1;
}

// The activation slot of each action (index into `actions`; -1 for
// whole-step actions): a forward takes the lowest free slot, the action
// that closes its micro-batch (see max_live_activations) frees it, and
// every action of that micro-batch and chunk in between uses it. Slots in
// use never exceed max_live_activations(actions). The slots are then
// numbered by what they held (core/slot_kinds.hpp), which renames them
// and changes nothing else.
std::vector<int> activation_slots(const std::vector<Action>& actions);

// What those slots held over the step: how many only ever held the
// stage's chunk 0, its last chunk, or both (core/slot_kinds.hpp), of
// max_live_activations(actions).
SlotKinds slot_kinds(const std::vector<Action>& actions);

// Most micro-batches whose activations a stage holds at once under `actions`
// (a forward opens one; its backward closes it, or its W where the
// schedule splits the backward: W reads what the forward kept): the size
// of the activation pool.
int max_live_activations(const std::vector<Action>& actions);

// slot_kinds of pipeline_schedule(kind, num_stages, stage, num_micro,
// chunks), remembered per arguments: the planner asks it of every stage of
// tens of thousands of layouts, most of which share their pipelines.
SlotKinds schedule_slots(ScheduleKind kind, int num_stages, int stage, int num_micro,
                         int chunks = 1);

// Every stage's pipeline_schedule, stage by stage, remembered (the most
// recent, 64 MB at most): the planner simulates tens of thousands of steps
// whose layouts share their pipelines.
std::shared_ptr<const std::vector<std::vector<Action>>> pipeline_schedules(ScheduleKind kind,
                                                                           int num_stages,
                                                                           int num_micro,
                                                                           int chunks = 1);

// The buffers stage `stage`'s input-gradient sends take turns in under
// `kind`: each send holds one until it completes, and a send that finds
// none free waits for the oldest in flight (the receiver takes them in
// order). How many: the smallest power of two from 2 with which a run of
// every stage reaches the step's end when a send completes only once its
// receive is posted (the worst a large message gets), with the trainer's
// other waits; cached per (kind, stages, micro-batches, chunks). Never
// more than the activation slots (a buffer per slot is what the trainer
// held before). 0 where the stage sends no gradient.
int gradient_send_buffers(ScheduleKind kind, int num_stages, int stage, int num_micro,
                                 int chunks = 1);

}  // namespace mpiformer
