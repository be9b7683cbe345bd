// GoogleTest main for every unit test binary: MPI first, then Kokkos, then
// the tests, torn down in reverse (as Cabana's harness does). Only rank 0
// prints results when the binary runs under mpirun.
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <Kokkos_Core.hpp>
#include <filesystem>
#include <string>

#include "node_threads.hpp"
#include "rank0_results.hpp"

int main(int argc, char** argv) {
  // Started without mpirun (a singleton, as ctest runs the unit tests two
  // at a time), Open MPI creates its session directories under TMPDIR, and
  // two processes starting at once race on the shared top one: each gets
  // its own, removed at the end. Under mpirun the launcher's is used.
  std::string own_tmp;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {
    // A singleton needs no daemon (Open MPI starts one unless told, 0.2 s
    // of each of the suite's 200 test processes) nor a network transport
    // (probing UCX, absent here, costs as much again). The environment's
    // own settings win.
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    setenv("OMPI_MCA_pml", "ob1", 0);
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/mpiformer-test-XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) {
      own_tmp = pattern;
      setenv("TMPDIR", own_tmp.c_str(), 1);
    }
  }
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  mpiformer::test::share_node_cores();
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    mpiformer::test::print_results_on_rank0_only(rank);
    rc = RUN_ALL_TESTS();
  }
  MPI_Finalize();
  if (!own_tmp.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(own_tmp, ec);
  }
  return rc;
}
