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

#include "core/rng.hpp"
#include "host/gemm.hpp"
#include "model/gpt_stage.hpp"

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

// A step's loss and every gradient bit for bit at 1, 2 and 3 threads, in
// fp32 and bf16: the loops write only their own indices and sum in a fixed
// order. (Shapes chosen so every parallel loop has several iterations.)
template <class A>
std::vector<float> gradients_at(int threads, double* loss) {
  host::set_compute_threads(threads);
  GptConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.seq_len = 32;
  cfg.vocab_size = 300;
  host::Context ctx;
  GptStage<host::Ops<A>> stage(ctx, cfg, partition_stage(cfg, 0, 1), 3, 1);
  stage.init_parameters(11);
  Rng rng(5, "tokens");
  std::vector<int32_t> tokens(3 * cfg.seq_len), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(300));
  for (auto& t : targets) t = static_cast<int32_t>(rng.below(300));
  stage.forward(0, tokens.data(), targets.data(), true, 1.0f / 96);
  stage.backward(0);
  *loss = stage.take_loss_sum();
  return std::vector<float>(stage.grads(), stage.grads() + stage.param_storage());
}

template <class A>
void expect_thread_count_independent() {
  double l1 = 0, l2 = 0, l3 = 0;
  const auto g1 = gradients_at<A>(1, &l1);
  const auto g2 = gradients_at<A>(2, &l2);
  const auto g3 = gradients_at<A>(3, &l3);
  host::set_compute_threads(host::choose_compute_threads(0, 1));
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(l1, l3);
  EXPECT_TRUE(g1 == g2) << "2 threads";
  EXPECT_TRUE(g1 == g3) << "3 threads";
}

TEST(ComputeThreads, ResultsDoNotDependOnTheThreadCount) {
  expect_thread_count_independent<float>();
  expect_thread_count_independent<host::Bf16>();
}

}  // namespace
}  // namespace mpiformer
