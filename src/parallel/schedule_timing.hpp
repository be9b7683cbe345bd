// The time one optimizer step takes, from the schedule itself: every
// stage's action list (pipeline_schedule, the same lists the trainer
// walks) played out together with a duration per action, as the planner
// predicts a layout's step before it runs (issue 15's simulator). Sends
// never block and arrive `p2p` seconds after they start; a receive waits
// for its message; the step ends when the last stage has reduced its
// gradients, then every stage takes the optimizer step together (the
// step's all-reduce). The bubble is what the simulation shows, not a
// formula: unequal stages, messages and reductions all show where they
// fall.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/pipeline_schedule.hpp"

namespace mpiformer {

// Seconds per action, per virtual stage (index = chunk x stages + stage:
// the stage itself without interleaving).
struct ActionCosts {
  // One micro-batch. `weights` (empty: none) is the part of the backward
  // that only computes weight gradients: its own action (W) where the
  // schedule splits the backward, else part of the backward's time.
  std::vector<double> forward, backward, weights;
  std::vector<double> reduce;             // the gradient reduction left after backward (per stage)
  // ZeRO on a device (train/zero_shards.hpp): the stage's
  // data-parallel stream, one transfer after another, each starting once
  // the stage's computation has reached the point that issued it, and
  // running beside whatever the stage computes next. Per virtual stage;
  // empty: none (the pass costs hold the transfers). Each pass's time,
  // but its embedding's and head's (`lead`, `tail`), is spread evenly over
  // its blocks (forward from the first, backward and W from the last):
  //  - zero 2-3: each block's gradients reduce-scattered after its
  //    backward (W where the schedule splits it), in two windows taken in
  //    turn: a block's backward waits until the reduction before the last
  //    has finished. The step's reduction waits for the stream.
  //  - zero 3: each block's weights gathered into window i % 2 before it
  //    computes (forward, backward or B), the next block's issued as this
  //    one starts, none where the window still holds the block.
  //  - zero 0-1: the stage's whole gradients, summed over the
  //    micro-batches: each block's reduced (all-reduced, reduce-scattered)
  //    once its last micro-batch's backward (W) is done (`final_reduce`);
  //    no window to wait for.
  //  - zero 0-3: the tensors outside the blocks, kept whole, reduced once
  //    their last micro-batch's backward is done (`reduced`): those after
  //    the blocks (the final norm's, the head's) after the head's backward,
  //    those before them (the embedding's, a tied copy) at the end of the
  //    stage's first chunk's backward (W).
  //  - zero 1-3: the weights the last step's AdamW updated, gathered in
  //    the order the forward uses them (the embedding's, each block's, the
  //    final norm's and head's: `published`) from the step's start, each
  //    forward waiting for what it is about to use.
  struct BlockTransfers {
    int64_t first = 0;   // the chunk's first block, counted in the stage
    int64_t blocks = 0;  // its blocks (0: none)
    double reduce = 0;   // one block's reduce-scatter, every micro-batch (0: none)
    double gather = 0;   // one block's all-gather (0: none)
    double publish = 0;  // one block's all-gather after AdamW (0: none)
    double final_reduce = 0;  // one block's reduction after the last micro-batch (0: none)
    // The seconds of each pass (forward, backward, W) before the chunk's
    // blocks and after them: the forward's embedding and head, the
    // backward's head and embedding (W's embedding). The rest of a pass is
    // spread evenly over its blocks.
    std::array<double, 3> lead{}, tail{};
    // Zero 3's vocabulary through the windows beside the blocks
    // (StageLayout::window_of): the embedding's pieces before the first
    // block, the head's after the last (0: none there). One piece takes
    // the window its neighbouring block does not; two or more take both.
    int64_t embedding_pieces = 0, head_pieces = 0;
  };
  std::vector<BlockTransfers> block_transfers;
  // Per stage (with block_transfers): a transfer of the tensors outside
  // the blocks, those the embedding uses and those the head uses (after
  // AdamW), or those before and after the blocks (reduced).
  struct Outside {
    double embedding = 0, head = 0;
  };
  std::vector<Outside> published;  // all-gathers after AdamW
  std::vector<Outside> reduced;    // reductions after the last micro-batch
  double optimizer = 0;                   // AdamW and the step's all-reduce
  double p2p = 0;                         // one activation or gradient message
};

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct SimulatedStep {
  double step_time = 0;
  std::vector<double> compute;  // per stage: forward + backward (+ W) seconds
  std::vector<double> waiting;  // per stage: blocked receiving, and idle before the step's end
  // Per stage: passes stalled on the data-parallel stream (a gradient
  // window, a block's weights) and the step's reduction waiting for it
  // (ActionCosts::block_transfers).
  std::vector<double> reduction_waits;
  std::vector<std::vector<TimedAction>> timeline;  // per stage, in order
  // The share of the stages' time not spent computing forward, backward
  // or W (waiting for messages, for other stages, reducing): the bubble
  // when reductions cost nothing.
  double idle_fraction() const;
};

// Throws std::invalid_argument if the costs do not cover `num_stages`
// (times `chunks`), or std::logic_error if the schedules could not finish
// (a deadlock).
// `keep_timeline`: false leaves `timeline` empty (the rest is the same).
SimulatedStep simulate_step(ScheduleKind kind, int num_stages, int num_micro,
                            const ActionCosts& costs, int chunks = 1, bool keep_timeline = true);

// A floor under simulate_step's step_time for the same arguments, without
// simulating: the busiest stage's own actions back to back, then the
// optimizer (waiting only adds), less a part in 1e9 for the sums' rounding.
// A search uses it to skip layouts that cannot beat those it keeps.
double step_time_floor(ScheduleKind kind, int num_stages, int num_micro, const ActionCosts& costs,
                       int chunks = 1);

// The timeline as a Chrome trace (one process per stage, spans in
// microseconds), to set beside a measured trace of the same layout.
std::string timeline_trace(const SimulatedStep& step);

}  // namespace mpiformer
