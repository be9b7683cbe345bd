// Private to the trainer's translation units: its state and small helpers.
#pragma once
#include "train/trainer.hpp"
#include <chrono>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include "core/error.hpp"
#include "core/format.hpp"
#include "host/adamw.hpp"
#include "host/gemm.hpp"
#include "model/gpt_stage.hpp"
#include "parallel/input_agreement.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/process_grid.hpp"
#include "token_dataset.hpp"
#include "checkpoint.hpp"
#include "checkpoint_store.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/checkpointing.hpp"
#include "train/grad_reducer.hpp"
#include "train/lr_schedule.hpp"
#include "train/metrics_log.hpp"
#include "train/model_flops.hpp"
#include "train/sample_order.hpp"
#include "train/stop_request.hpp"
#include "train/trace_writer.hpp"

namespace mpiformer {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Message tags: activations and gradients of micro-batch m never share one.
inline int activation_tag(int micro) { return 2 * micro; }
inline int gradient_tag(int micro) { return 2 * micro + 1; }

struct Trainer::State {
  TokenDataset train;
  std::unique_ptr<TokenDataset> val;
  GptConfig cfg;
  std::unique_ptr<ProcessGrid> grid;
  std::vector<Action> actions;  // this stage's schedule for one step
  std::unique_ptr<GptStage<float>> stage;
  std::unique_ptr<AdamWOptimizer<float>> opt;
  std::unique_ptr<SampleOrder> order;
  std::unique_ptr<GradReducer> reducer;
  std::unique_ptr<TraceWriter> trace;
  std::vector<int64_t> eval_windows;
  // The activation pool: one entry per slot the schedule keeps live.
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<std::vector<float>> grad_out;
  std::vector<Pending> act_sends, grad_sends;
  std::vector<float> grad_in;
  std::vector<int32_t> window;
  double flops_per_token = 0, peak_flops = 0;
  int64_t start_step = 0;  // steps already done (from a checkpoint)
  int64_t cursor = 0;      // global sample position of the next step
  bool resumed = false;
  explicit State(const std::string& train_path) : train(train_path) {}
};

struct Trainer::StepTimes {
  double recv_wait = 0;       // blocked receiving activations or gradients
  double reduce_exposed = 0;  // data-parallel reduction not hidden by backward
};

}  // namespace mpiformer
