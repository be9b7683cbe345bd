// Where a run reports progress: one human line per logging interval on
// stdout (rank 0) and one JSON object per line in <run.dir>/metrics.jsonl.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace mpiformer {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of optimizer steps done
  int64_t steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0, step_ms = 0, eta_s = 0;
  double matmul_fraction = 0;  // of the step time spent in GEMMs
  int64_t samples = 0;         // global data position after the step
  // Pipeline (pp > 1): mean over ranks of the time waiting to receive, over
  // the step time, and (pp-1)/(m+pp-1). Data parallel (dp > 1): the
  // gradient all-reduce time backward did not hide, per step.
  bool pipelined = false, data_parallel = false;
  // The matmul share, the bubble and the exposed reduction are host-side
  // timings: meaningless where the work is queued on GPU streams, so a GPU
  // run logs none of them (the bubble's theory only).
  bool host_timings = true;
  double bubble = 0, bubble_theory = 0, reduce_exposed_ms = 0;
  // Data parallel: MB each rank sent to its group per step, counted from the
  // collectives issued (ring model).
  double dp_sent_mb = 0;
  // Tensor parallel (tp > 1): the share of the step time in the tensor
  // group's all-reduces (host timings) and the MB each rank sent to it per
  // step (ring model).
  bool tensor_parallel = false;
  double tp_reduce_fraction = 0, tp_sent_mb = 0;
  // The optimizer step per step, mean over ranks (host timings): AdamW,
  // the streaming of offloaded state, ZeRO's gathers after it.
  double optimizer_ms = 0;
  // A Mixture of Experts (step_executor.hpp's StepResult): the mean aux
  // and z losses, the share of assignments dropped, the least and most
  // loaded experts over their fair share.
  bool moe = false;
  double aux_loss = 0, z_loss = 0, dropped = 0, load_min = 0, load_max = 0;
  // Context parallelism: the ring's attention per step (its arithmetic
  // and its waits for the next block; mean over ranks, host timings), of
  // which the waits, and the MB each rank sent round the ring.
  bool context_parallel = false;
  double cp_ring_ms = 0, cp_wait_ms = 0, cp_sent_mb = 0;
  // Expert parallelism: the all-to-alls per step (mean over ranks; host
  // timings) and the MB each rank sent in them.
  bool expert_parallel = false;
  double ep_alltoall_ms = 0, ep_sent_mb = 0;
  // Why this step's update was skipped, or why the run stops at it (empty:
  // applied), and the updates skipped so far.
  std::string skipped, stopped;
  int64_t skipped_steps = 0;
  // fp16: the step's loss scale, whether it overflowed, overflows so far.
  bool loss_scaling = false, overflow = false;
  double loss_scale = 1;
  int64_t overflows = 0;
};

class MetricsLog {
 public:
  // Only the rank that logs opens the file; others make a no-op log. The
  // run directory must exist.
  // `append` keeps the lines of earlier segments of the same run (resume).
  MetricsLog(const std::string& run_dir, bool active, bool append);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void step(const StepMetrics& m);
  void eval(int64_t step, int64_t steps, double val_loss,
            const std::vector<std::pair<std::string, double>>& per_source = {});
  // Any other record, one JSON object (the memory accounting).
  void record(const std::string& json);
  const std::string& path() const { return path_; }

 private:
  void write_line(const std::string& json);
  bool active_;
  std::string path_;
  int fd_ = -1;  // appended to a whole line at a time
};

}  // namespace mpiformer
