// GoogleTest main for every unit test binary: MPI first, then Kokkos, then
// the tests, torn down in reverse (as Cabana's harness does). Only rank 0
// prints results when the binary runs under mpirun.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    rc = RUN_ALL_TESTS();
  }
  MPI_Finalize();
  return rc;
}
