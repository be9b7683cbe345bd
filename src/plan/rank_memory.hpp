// What one rank of a layout holds, by category, from the deck alone: the
// memory accounting the trainer refuses a deck with (before anything is
// allocated) and the planner builds on. BackendChoice is the device and
// precision a rank computes with (train/backend_factory.hpp resolves it).
#pragma once
#include <string>
#include <vector>

#include "deck.hpp"
#include "model/stage_footprint.hpp"
#include "model/stage_options.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace mpiformer {

struct BackendChoice {
  Device device = Device::kCpu;  // resolved: never kAuto
  Precision precision = Precision::kFp32;
  int gpu = -1;         // the device ordinal on kCuda
  std::string why_cpu;  // on kCpu: why no GPU
  int sharing = 1;      // ranks sharing this rank's memory (its node's, or its GPU's)
};

// The bytes this rank's stage and optimizer will allocate on its device
// (the stage's buffers exactly, the AdamW moments, ZeRO's shard and
// receive buffers, and the device context's scratch), by category, as the
// accounting prints them and the refusal below words them. A pure
// function of the deck (model, layout, zero, recompute, precision,
// micro-batch) and the schedule's slots: what the planner builds on.
struct RankMemory {
  int slots = 0;  // activation slots of the stage's schedule
  StageFootprint stage;
  double shard = 0;            // ZeRO: the group's largest shard, elements (not bytes)
  double shard_master = 0;     // ZeRO: master weights of the shard (and its Act copy)
  double shard_gradients = 0;  // ZeRO: the reduced gradients of the shard
  double optimizer = 0;        // AdamW's two moments (whole, or the shard)
  double comm = 0;             // buffers only messages use (zero >= 2: two block parts; pipeline sends)
  double workspace = 0;        // the device context's scratch
  // [train] offload (moments, and masters in mixed precision): the blocks
  // they stream through in the back end's memory (the host's read-ahead
  // ring; on the host, "host" counts them under optimizer); and outside
  // it, a GPU run's: the state in host memory ("host") or the ring
  // ("nvme"), with its page-locked buffers; and the files on disk.
  double offload_buffers = 0;
  double offload_host = 0;
  double offload_disk = 0;
  // What saves hold in host memory: [checkpoint] async's snapshot, and a
  // save's write and read-back buffers while it runs (where the deck
  // saves). In the total where the host is the back end's memory.
  double checkpoint_snapshot = 0;
  double checkpoint_io = 0;
  bool saves_in_total = false;
  double parameters() const { return stage.parameters + stage.weight_copy + shard_master; }
  double gradients() const { return stage.gradients + shard_gradients; }
  double total() const {
    return parameters() + gradients() + optimizer + stage.activations + stage.scratch + comm +
           workspace + offload_buffers +
           (saves_in_total ? checkpoint_snapshot + checkpoint_io : 0);
  }
};
RankMemory rank_memory(const Deck& deck, const BackendChoice& choice, int stage_index,
                       const SlotKinds& slots);
// The bytes context parallelism's ring holds on a rank (cp > 1; 0
// otherwise): what train/context_attention.hpp allocates, which the
// memory accounting adds. `device`: the GPU's op set, whose kernels keep
// their scores in registers (the host's query tiles hold scratch).
double context_attention_bytes(const GptConfig& cfg, int64_t tp, int64_t micro_batch, int64_t cp,
                               size_t act_bytes, size_t acc_bytes, Device device = Device::kCpu);

// The elements of each moment in one block of the offloaded update
// ([train] offload_block_mb, whole multiples of the files' 4 KiB).
int64_t offload_block_elements(const TrainConfig& train);

// The stage options a deck asks for, with `slots` from the schedule: what
// the trainer builds its stage with and the accounting predicts from.
StageOptions stage_options_of(const Deck& deck, const SlotKinds& slots);
// The layers (chunks, under interleaving) stage `stage_index` holds, and
// its schedule for one step: the same for the trainer, the accounting and
// the planner.
// ep_rank: the rank's place in its expert-parallel group (every place
// holds as many experts: the accounting uses 0).
StageRange stage_range_of(const Deck& deck, int stage_index, int64_t tp_rank, int64_t ep_rank = 0);
std::vector<Action> stage_schedule(const Deck& deck, int stage_index);
// The buffers stage `stage_index`'s input-gradient sends take turns in
// (pipeline_schedule.hpp's gradient_send_buffers): what the trainer
// allocates and the accounting counts.
int stage_grad_send_buffers(const Deck& deck, int stage_index);

}  // namespace mpiformer
