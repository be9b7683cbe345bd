// Under mpirun every rank runs the same GoogleTest binary: only rank 0
// prints results, so a log shows one report (a rank's failure still
// fails RUN_ALL_TESTS on that rank and so mpirun's exit status).
#pragma once

#include <gtest/gtest.h>

namespace mpiformer::test {

inline void print_results_on_rank0_only(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
}

}  // namespace mpiformer::test
