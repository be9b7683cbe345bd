// The one place that knows which back ends this build has: which device a
// rank runs on, the stage for it, and the communicators that move that
// stage's buffers. The training loop sees StageBackend and Communicator
// only, and has no #ifdef.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "deck.hpp"
#include "model/parameter_table.hpp"
#include "model/stage_footprint.hpp"
#include "parallel/mpi_session.hpp"
#include "parallel/communicator.hpp"
#include "parallel/process_grid.hpp"
#include "train/stage_backend.hpp"

namespace mpiformer {

struct BackendChoice {
  Device device = Device::kCpu;  // resolved: never kAuto
  Precision precision = Precision::kFp32;
  int gpu = -1;         // the device ordinal on kCuda
  std::string why_cpu;  // on kCpu: why no GPU
  int sharing = 1;      // ranks sharing this rank's memory (its node's, or its GPU's)
};

// Resolves [run] device against the build and the node, and checks [train]
// precision against the result; the GPU is the node-local rank modulo the
// GPUs visible. Local: throws InputError.
BackendChoice choose_backend(const Deck& deck, NodePlace node);

// The bytes this rank's stage and optimizer will allocate on its device
// (the stage's buffers exactly, the AdamW moments, ZeRO's shard and
// receive buffers, and the device context's scratch), by category, as the
// accounting prints them and the refusal below words them. A pure
// function of the deck (model, layout, zero, recompute, precision,
// micro-batch) and the schedule's slots: what the planner builds on.
struct RankMemory {
  int slots = 0;  // activation slots of the stage's schedule
  StageFootprint stage;
  double shard_master = 0;     // ZeRO: master weights of the shard (and its Act copy)
  double shard_gradients = 0;  // ZeRO: the reduced gradients of the shard
  double optimizer = 0;        // AdamW's two moments (whole, or the shard)
  double comm = 0;             // buffers only collectives use (zero >= 2: two block parts)
  double workspace = 0;        // the device context's scratch
  double parameters() const { return stage.parameters + stage.weight_copy + shard_master; }
  double gradients() const { return stage.gradients + shard_gradients; }
  double total() const {
    return parameters() + gradients() + optimizer + stage.activations + stage.scratch + comm +
           workspace;
  }
};
RankMemory rank_memory(const Deck& deck, const BackendChoice& choice, int stage_index, int slots);

// The stage this rank runs at `place` (parameters not yet initialised).
// First compares rank_memory with what the device has left for each rank
// sharing it: a deck that cannot fit is an InputError naming the keys and
// the bytes, before anything is allocated.
std::unique_ptr<StageBackend> make_stage_backend(const Deck& deck, const BackendChoice& choice,
                                                 const GptConfig& cfg, const GridPlace& place,
                                                 int slots);

// The communicators that move one stage's buffers: the grid's MPI groups on
// the host; on GPUs NCCL, or MPI through host memory where the ranks of a
// group share a GPU. Pipeline traffic in each direction has its own.
struct StageComms {
  Communicator* pipe_act = nullptr;   // activations, stage s -> s + 1
  Communicator* pipe_grad = nullptr;  // gradients, stage s + 1 -> s
  Communicator* dp = nullptr;
  Communicator* tp = nullptr;    // the tensor group (the stage all-reduces over it itself)
  Communicator* tied = nullptr;  // null unless this rank holds a copy of the tied embedding
  std::string description;       // what the GPU groups use, for the summary
  std::vector<std::unique_ptr<Communicator>> owned;
};

// Collective over the grid; gives the stage its tensor group. Every group,
// one-rank groups included, gets a communicator of the stage's memory.
StageComms connect_stage(ProcessGrid& grid, StageBackend& stage);

// Throws std::logic_error naming the group when a communicator of `c`
// works on another memory than the stage's buffers (host MPI handed
// device pointers, or the reverse).
void check_memory_spaces(const StageComms& c, bool stage_on_device);

}  // namespace mpiformer
