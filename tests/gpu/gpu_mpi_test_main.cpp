// GoogleTest main for the GPU test binaries launched under mpirun: MPI
// first; exits 77 (CTest: skipped) on every rank, with the reason, where
// no GPU is usable; results printed by rank 0 only.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "../unit/node_threads.hpp"
#include "../unit/rank0_results.hpp"
#include "cuda/device.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string why;
  if (mpiformer::cuda::device_count(&why) == 0) {
    if (rank == 0) std::printf("SKIP: no usable GPU (%s)\n", why.c_str());
    MPI_Finalize();
    return 77;
  }
  mpiformer::test::share_node_cores();
  ::testing::InitGoogleTest(&argc, argv);
  mpiformer::test::print_results_on_rank0_only(rank);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
