// The dp x pp x tp process grid. Ranks are laid out tensor-parallel
// fastest, then data-parallel, then pipeline stage: world rank
// r = (stage * dp + dp_rank) * tp + tp_rank. A tensor group (the largest
// and most frequent traffic: all-reduces inside every block) is then made
// of neighbouring ranks, inside a node whenever tp divides the ranks per
// node; the replicas of a stage come next, so the data-parallel reduction
// stays within a node when dp x tp divides it; pipeline neighbours, which
// exchange the least, may be on other nodes.
//
// Context parallelism (cp > 1) splits each data-parallel replica's
// sequences over cp ranks. They hold the same parameters, so they are
// replicas of the stage like any other: the grid's replica axis has
// dp x cp ranks, the cp ranks of one data replica neighbours on it
// (replica = data rank x cp + cp rank; the ring's traffic is the larger),
// and the data-parallel group, which sums the gradients and shares out
// ZeRO's shards, is all dp x cp of them.
#pragma once
#include <memory>

#include "parallel/mpi_communicator.hpp"

namespace mpiformer {

// Where world rank `rank` sits in a grid of dp x tp ranks per stage.
struct GridPlace {
  int stage = 0, dp_rank = 0, tp_rank = 0;
};
inline GridPlace grid_place(int rank, int dp, int tp) {
  return GridPlace{rank / (dp * tp), (rank / tp) % dp, rank % tp};
}
// The world rank at a place.
inline int grid_rank(const GridPlace& p, int dp, int tp) {
  return (p.stage * dp + p.dp_rank) * tp + p.tp_rank;
}

class ProcessGrid {
 public:
  // `kv_share`: how many neighbouring tensor ranks hold each kv head
  // (GptConfig::kv_share; 1: each holds its own).
  // `ep`: the replicas sharing out a Mixture of Experts' experts (dividing
  // dp; 1: each holds them all).
  // `dp`: the data-parallel replicas (the deck's); `cp`: the ranks each
  // replica's sequences are split over.
  ProcessGrid(int dp, int pp, int tp = 1, MPI_Comm world = MPI_COMM_WORLD, int kv_share = 1,
              int ep = 1, int cp = 1);

  // The stage's replicas: dp x cp (what reduces and shards the gradients).
  int dp() const { return dp_; }
  int cp() const { return cp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int world_rank() const { return world_rank_; }
  int stage() const { return place_.stage; }
  int dp_rank() const { return place_.dp_rank; }
  int tp_rank() const { return place_.tp_rank; }
  int ep() const { return ep_; }
  int ep_rank() const { return place_.dp_rank % ep_; }
  bool first_stage() const { return stage() == 0; }
  bool last_stage() const { return stage() == pp_ - 1; }
  // The world rank of the same replica and tensor rank at another stage.
  int rank_of_stage(int stage) const {
    return grid_rank(GridPlace{stage, dp_rank(), tp_rank()}, dp_, tp_);
  }

  // The replicas of this stage holding this tensor slice (size dp), this
  // replica's pipeline of this slice (size pp; group rank = stage), the
  // tensor group of this stage and replica (size tp; group rank = tp rank),
  // every rank of this stage (size dp x tp; the checkpoint's gathers of a
  // whole tensor), and, when pp > 1 on the first and last stage, the pair
  // holding the two copies of the tied embedding's slice (group rank 0 =
  // first).
  MpiCommunicator& data_parallel() { return *dp_comm_; }
  MpiCommunicator& pipeline() { return *pp_comm_; }
  MpiCommunicator& tensor_parallel() { return *tp_comm_; }
  MpiCommunicator& stage_group() { return *stage_comm_; }
  MpiCommunicator* tied_embedding() { return tied_comm_->valid() ? tied_comm_.get() : nullptr; }
  // The tensor ranks sharing this rank's kv heads (group rank = tp rank
  // % kv_share), which sum those heads' gradients; null when kv_share is 1.
  MpiCommunicator* kv_heads() { return kv_comm_->valid() ? kv_comm_.get() : nullptr; }
  MpiCommunicator& world() { return *world_comm_; }
  // The cp ranks sharing this rank's sequences (group rank = cp rank).
  MpiCommunicator& context_parallel() { return *cp_comm_; }
  // Expert parallelism: the ep replicas sharing out the experts (group
  // rank = ep_rank), and the dp / ep replicas holding this rank's experts
  // (their gradients' reduction; at ep 1 the data-parallel group's ranks).
  MpiCommunicator& expert_parallel() { return *ep_comm_; }
  MpiCommunicator& expert_data_parallel() { return *expert_dp_comm_; }
  // The ranks of this stage holding the same tensors as this one (every
  // rank of the stage at ep 1; the replicas ep apart, with their tensor
  // ranks, otherwise): what reads a checkpoint's shares together.
  MpiCommunicator& same_tensors() { return *holders_comm_; }

 private:
  int dp_, pp_, tp_, ep_, cp_, world_rank_ = 0;
  GridPlace place_;
  std::unique_ptr<MpiCommunicator> world_comm_, dp_comm_, pp_comm_, tp_comm_, stage_comm_,
      tied_comm_, kv_comm_, ep_comm_, expert_dp_comm_, holders_comm_, cp_comm_;
};

}  // namespace mpiformer
