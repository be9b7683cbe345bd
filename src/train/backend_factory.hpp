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
#include "plan/rank_memory.hpp"
#include "train/stage_backend.hpp"

namespace mpiformer {

// Resolves [run] device against the build and the node, and checks [train]
// precision against the result; the GPU is the node-local rank modulo the
// GPUs visible. Local: throws InputError.
BackendChoice choose_backend(const Deck& deck, NodePlace node);

// The stage this rank runs at `place` (parameters not yet initialised).
// First compares rank_memory with what the device has left for each rank
// sharing it: a deck that cannot fit is an InputError naming the keys and
// the bytes, before anything is allocated.
std::unique_ptr<StageBackend> make_stage_backend(const Deck& deck, const BackendChoice& choice,
                                                 const GptConfig& cfg, const GridPlace& place,
                                                 const SlotKinds& slots);

// The communicators that move one stage's buffers: the grid's MPI groups on
// the host; on GPUs NCCL, or MPI through host memory where the ranks of a
// group share a GPU. Pipeline traffic in each direction has its own.
struct StageComms {
  Communicator* pipe_act = nullptr;   // activations, stage s -> s + 1
  Communicator* pipe_grad = nullptr;  // gradients, stage s + 1 -> s
  Communicator* dp = nullptr;
  Communicator* tp = nullptr;    // the tensor group (the stage all-reduces over it itself)
  Communicator* tied = nullptr;  // null unless this rank holds a copy of the tied embedding
  Communicator* kv = nullptr;    // the tensor ranks sharing its kv heads; null where none do
  // Expert parallelism (ep > 1; null otherwise): the replicas sharing out
  // the experts (their rows), and those holding this rank's experts (their
  // gradients' reduction).
  Communicator* ep = nullptr;
  Communicator* expert_dp = nullptr;
  // Context parallelism (cp > 1; null otherwise): the ring's group.
  Communicator* cp = nullptr;
  std::string description;       // what the GPU groups use, for the summary
  std::vector<std::unique_ptr<Communicator>> owned;
};

// Collective over the grid; gives the stage its tensor group. Every group,
// one-rank groups included, gets a communicator of the stage's memory.
StageComms connect_stage(ProcessGrid& grid, StageBackend& stage,
                         ContextChunks order = ContextChunks::kHeadTail);

// Throws std::logic_error naming the group when a communicator of `c`
// works on another memory than the stage's buffers (host MPI handed
// device pointers, or the reverse).
void check_memory_spaces(const StageComms& c, bool stage_on_device);

}  // namespace mpiformer
