// One layout's step, predicted: memory per rank from the accounting the
// run itself checks (rank_memory), and the step time from the schedule's
// own action lists (simulate_step) with each action priced by a machine
// file: the stage's ops (model/stage_work) at the machine's matmul and
// attention tables and kernel bandwidths, the tensor group's all-reduces
// inside them, ZeRO's gathers and reduce-scatters where the trainer runs
// them, the data-parallel reduction left after backward, and AdamW.
//
// What it assumes (stated, so a wrong prediction can be traced):
//  - one rank per device; where more ranks share a node's devices than it
//    has (an oversubscribed workstation), their compute is slowed by the
//    share (ranks / devices);
//  - collectives cost the ring algorithm's steps x latency plus bytes at
//    the link's bus bandwidth; a group inside one node uses [intra], one
//    across nodes [inter] (ranks fill nodes in grid order: tp fastest);
//  - on the host, MPI collectives progress only while the rank waits on
//    them, so the data-parallel reduction and ZeRO's transfers are exposed;
//    on a GPU (NCCL on its own stream) the reduction hides behind the last
//    micro-batch's backward and zero 3's next-block gather behind the
//    current block;
//  - [train] offload: AdamW runs on the host over the moments (and the
//    masters in mixed precision), read and written once a step on the
//    node's disk, which its ranks share ([offload] in the machine file);
//    a GPU's gradients and updated weights cross its host link; disk,
//    link and the host's update overlap, the slowest pacing the step.
#pragma once
#include <string>
#include <vector>

#include "deck.hpp"
#include "machine_file.hpp"
#include "model/stage_work.hpp"
#include "parallel/schedule_timing.hpp"
#include "plan/rank_memory.hpp"

namespace mpiformer {

// What the planner varies; global_batch and the model stay the deck's.
struct Layout {
  int64_t dp = 1, pp = 1, tp = 1, micro_batch = 1, zero = 0;
  Recompute recompute = Recompute::kNone;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  bool sequence_parallel = false;
  int64_t virtual_stages = 1;  // chunks per stage (interleaved)
  Offload offload = Offload::kNone;  // [train] offload
  int64_t ep = 1;                    // expert parallelism (a Mixture of Experts)
  int64_t cp = 1;                    // context parallelism
  // "dp 2 pp 1 tp 1 mb 4 zero 0 none 1f1b" ("interleaved v2"; + " sp";
  // + " ep 2"; + " cp 2"; + " offload nvme")
  std::string describe() const;
};
Layout layout_of(const Deck& deck);
Deck with_layout(const Deck& deck, const Layout& layout);

struct Prediction {
  Layout layout;
  std::vector<RankMemory> memory;  // per stage
  double memory_max = 0;           // the fullest rank, with the machine's runtime bytes
  double runtime = 0;              // of which the runtime's (libraries beyond the accounting)
  double memory_available = 0;     // per rank
  double memory_planned = 0;       // of which a layout may use: less [parallel] memory_margin
  bool fits = false;               // memory_max <= memory_planned
  bool timed = false;              // the step was simulated (else step, bubble, tokens/s, MFU are 0)
  SimulatedStep step;              // the simulated timeline
  double compute = 0;              // the slowest stage's forward + backward (with tp collectives)
  double tp_comm = 0;              // of which: the tensor group's collectives
  double ep_comm = 0;              // and the expert-parallel group's all-to-alls
  double cp_comm = 0;              // and the context ring's sends not hidden by attention
  double expert_imbalance = 1;     // the busiest expert-parallel rank priced at (ep > 1)
  double exposed_comm = 0;         // data-parallel reduction, ZeRO transfers, optimizer gathers
  double bubble = 0;               // step_time - compute - exposed_comm - optimizer
  double optimizer = 0;
  double tokens_per_s = 0, mfu = 0;
  // The busiest stage's compute per step by kernel ("matmul", "gelu_backward", ...), seconds.
  std::vector<std::pair<std::string, double>> kernels;
};

// Seconds one kernel call takes on `machine` (the matmul table, or the
// file's rate at the share its tiles reach; the attention rows; the
// kernels' bandwidths).
double item_seconds(const MachineSpec& machine, const WorkItem& w);

// The sum of a stage's kernels for one micro-batch (forward, backward), at
// the machine's rates, before its stage_factor: what calibrate measures
// that factor against.
std::pair<double, double> kernel_seconds(const MachineSpec& machine, const GptConfig& cfg,
                                         const StageRange& range, int64_t micro_batch,
                                         Recompute recompute, double act_bytes);

// Throws InputError naming the machine file's [compute] precision when
// its rates are of another precision than the deck's.
void require_rates_for(const Deck& deck, const MachineSpec& machine);

// [parallel] expert_imbalance as the planner prices it: the deck's, or
// (0) the capacity factor where it is at least 1, else 1 (balanced).
double expert_imbalance(const Deck& deck);

// `ranks_per_node`: ranks on each node (0: the machine's devices_per_node).
// `time_if_fits`: a layout that does not fit is not timed (the planner's
// enumeration skips it; its step fields stay 0). `keep_timeline`: false
// leaves step.timeline empty (a search prices tens of thousands of
// layouts and shows a few). `time_if_faster_than` (tokens/s; 0: always):
// a layout that cannot reach it, even were no stage ever to wait
// (step_time_floor), is not timed either.
Prediction predict_step(const Deck& deck, const MachineSpec& machine, int ranks_per_node = 0,
                        bool time_if_fits = false, bool keep_timeline = true,
                        double time_if_faster_than = 0);

}  // namespace mpiformer
