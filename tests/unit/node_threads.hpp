// Under mpirun the ranks of a node share its cores as a training run's
// ranks do (train/trainer.cpp, host::choose_compute_threads): each rank's
// OpenMP and BLAS threads a share of the node, not the whole node each.
// Oversubscribed, 4 ranks of 2 spinning OpenMP threads on 2 cores ran the
// tensor-parallel tests a hundred times slower (37 s against 0.4 s).
#pragma once

#include <mpi.h>

#include "host/gemm.hpp"
#include "parallel/mpi_session.hpp"

namespace mpiformer::test {

inline void share_node_cores() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world == 1) return;  // alone: the defaults are the whole machine already
  host::set_compute_threads(host::choose_compute_threads(0, node_place().size));
}

}  // namespace mpiformer::test
