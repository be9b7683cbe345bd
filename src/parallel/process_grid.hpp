// The dp x pp process grid. World rank r holds pipeline stage r / dp and is
// replica r % dp of that stage: the replicas of a stage are neighbours, so
// the data-parallel all-reduce (the largest transfer) stays within a node
// whenever dp divides the ranks per node.
#pragma once
#include <memory>

#include "parallel/mpi_communicator.hpp"

namespace mpiformer {

class ProcessGrid {
 public:
  ProcessGrid(int dp, int pp, MPI_Comm world = MPI_COMM_WORLD);

  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int world_rank() const { return world_rank_; }
  int stage() const { return stage_; }
  int dp_rank() const { return dp_rank_; }
  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == pp_ - 1; }

  // The replicas of this stage (size dp), this replica's pipeline (size pp;
  // group rank = stage), and, when pp > 1 on the first and last stage, the
  // pair holding the two copies of the tied embedding (group rank 0 = first).
  MpiCommunicator& data_parallel() { return *dp_comm_; }
  MpiCommunicator& pipeline() { return *pp_comm_; }
  MpiCommunicator* tied_embedding() { return tied_comm_->valid() ? tied_comm_.get() : nullptr; }
  MpiCommunicator& world() { return *world_comm_; }

 private:
  int dp_, pp_, world_rank_ = 0, stage_ = 0, dp_rank_ = 0;
  std::unique_ptr<MpiCommunicator> world_comm_, dp_comm_, pp_comm_, tied_comm_;
};

}  // namespace mpiformer
