// The compute threads a rank takes (host/gemm.hpp): the deck's count, else
// the environment's, else its cores shared with the node's other ranks
// when the launcher did not bind it. Checked against this process's own
// affinity (sched_getaffinity), with the environment saved and restored.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "host/gemm.hpp"

namespace mpiformer {
namespace {

class SavedEnv {
 public:
  explicit SavedEnv(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) value_ = v;
    unsetenv(name);
  }
  ~SavedEnv() {
    if (value_) setenv(name_, value_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> value_;
};

TEST(ComputeThreads, DeckThenEnvironmentThenCores) {
  const SavedEnv blas("OPENBLAS_NUM_THREADS"), omp("OMP_NUM_THREADS");
  EXPECT_EQ(host::choose_compute_threads(3, 8), 3);
  setenv("OMP_NUM_THREADS", "5", 1);
  EXPECT_EQ(host::choose_compute_threads(0, 8), 5);
  setenv("OPENBLAS_NUM_THREADS", "2", 1);
  EXPECT_EQ(host::choose_compute_threads(0, 8), 2);  // the BLAS's own variable first
  unsetenv("OPENBLAS_NUM_THREADS");
  unsetenv("OMP_NUM_THREADS");
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int mine = CPU_COUNT(&set);
  const bool bound = mine < sysconf(_SC_NPROCESSORS_ONLN);
  EXPECT_EQ(host::choose_compute_threads(0, 1), mine);
  // Unbound, two ranks on the node share its cores; bound, the launcher
  // already gave this rank its share. Never below one thread.
  EXPECT_EQ(host::choose_compute_threads(0, 2), bound ? mine : std::max(1, mine / 2));
  EXPECT_GE(host::choose_compute_threads(0, 1000), 1);
}

}  // namespace
}  // namespace mpiformer
