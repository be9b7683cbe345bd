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

#include "host/gemm.hpp"
#include "parallel/input_agreement.hpp"
#include "parallel/mpi_session.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/process_grid.hpp"
#include "token_dataset.hpp"
#include "checkpoint.hpp"
#include "checkpoint_store.hpp"
#include "train/checkpointing.hpp"
#include "train/grad_reducer.hpp"
#include "train/lr_schedule.hpp"
#include "train/metrics_log.hpp"
#include "train/model_flops.hpp"
#include "train/sample_order.hpp"
#include "train/stage_backend.hpp"
#include "train/stop_request.hpp"
#include "train/trace_writer.hpp"
#ifdef MPIFORMER_HAVE_CUDA
#include "parallel/host_staged_communicator.hpp"
#endif
#ifdef MPIFORMER_HAVE_NCCL
#include "parallel/nccl_communicator.hpp"
#endif

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
  BackendChoice backend;
  std::unique_ptr<StageBackend> stage;
  // What moves the stage's activations and gradients: the grid's MPI
  // communicators on the host; NCCL (or host-staged MPI where ranks share a
  // GPU) on GPUs, owned here. Pipeline traffic in each direction has its
  // own communicator (see nccl_communicator.hpp).
  std::vector<std::unique_ptr<Communicator>> device_comms;
  Communicator* pipe_act = nullptr;   // activations, stage s -> s + 1
  Communicator* pipe_grad = nullptr;  // gradients, stage s + 1 -> s
  Communicator* dp = nullptr;
  Communicator* tied = nullptr;       // null unless this rank holds a tied copy
  std::string comms_kind;             // for the summary: what the GPU groups use
  std::unique_ptr<SampleOrder> order;
  std::unique_ptr<GradReducer> reducer;
  std::unique_ptr<TraceWriter> trace;
  std::vector<int64_t> eval_windows;
  // The activation pool: one entry per slot the schedule keeps live.
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<Pending> act_sends, grad_sends;
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
