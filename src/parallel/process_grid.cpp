#include "parallel/process_grid.hpp"

#include "core/error.hpp"
#include "core/mpi_check.hpp"

namespace mpiformer {

ProcessGrid::ProcessGrid(int dp, int pp, MPI_Comm world) : dp_(dp), pp_(pp) {
  int size = 0;
  MPI_CHECK(MPI_Comm_rank(world, &world_rank_));
  MPI_CHECK(MPI_Comm_size(world, &size));
  MPIFORMER_CHECK(dp * pp == size, "grid " + std::to_string(dp) + " x " + std::to_string(pp) +
                                       " does not match " + std::to_string(size) + " ranks");
  stage_ = world_rank_ / dp;
  dp_rank_ = world_rank_ % dp;
  MPI_Comm dup = MPI_COMM_NULL, dpc = MPI_COMM_NULL, ppc = MPI_COMM_NULL, tied = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_dup(world, &dup));
  MPI_CHECK(MPI_Comm_split(world, stage_, dp_rank_, &dpc));
  MPI_CHECK(MPI_Comm_split(world, dp_rank_, stage_, &ppc));
  const bool holds_wte = pp > 1 && (stage_ == 0 || stage_ == pp - 1);
  MPI_CHECK(MPI_Comm_split(world, holds_wte ? dp_rank_ : MPI_UNDEFINED, stage_, &tied));
  world_comm_ = std::make_unique<MpiCommunicator>(dup);
  dp_comm_ = std::make_unique<MpiCommunicator>(dpc);
  pp_comm_ = std::make_unique<MpiCommunicator>(ppc);
  tied_comm_ = std::make_unique<MpiCommunicator>(tied);
}

}  // namespace mpiformer
