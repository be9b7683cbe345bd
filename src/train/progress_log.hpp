// What a run reports as it goes: per logging interval, means over the
// interval's steps and over ranks (loss, lr, grad norm, tokens/s, MFU, ETA,
// bubble, exposed reduction), and each evaluation; written by MetricsLog to
// stdout (rank 0) and <run.dir>/metrics.jsonl.
#pragma once
#include <cstdint>

#include "deck.hpp"
#include "parallel/process_grid.hpp"
#include "train/metrics_log.hpp"
#include "train/stage_backend.hpp"
#include "train/step_executor.hpp"

namespace mpiformer {

class ProgressLog {
 public:
  // `rank_peak`: this rank's measured GEMM peak (0: `peak_flops` was
  // given, [run] peak_tflops, and is never re-measured); `peak_flops`: the
  // sum over ranks, MFU's denominator. On a noisy machine one measurement
  // can come out low: the peak is re-measured every kRemeasureEvery logged
  // intervals, and at once when an interval's MFU would read above 100%;
  // each rank keeps its best. `append`: a resumed run keeps the earlier
  // segments' lines.
  static constexpr int64_t kRemeasureEvery = 50;
  ProgressLog(const Deck& deck, ProcessGrid& grid, StageBackend& stage, double flops_per_token,
              double rank_peak, double peak_flops, bool append);
  double peak_flops() const { return peak_flops_; }

  // The waits the executor adds to during the current interval.
  StepTimes& times() { return times_; }
  // After step `done` (1-based) of a run ending at `end_step`; collective
  // at the steps that log.
  void step_done(int64_t done, int64_t end_step, double step_s, const StepResult& r,
                 int64_t samples);
  // `per_source`: each blended source's own validation loss, if any.
  void eval_done(int64_t done, double val_loss,
                 const std::vector<std::pair<std::string, double>>& per_source = {});
  // metrics.jsonl, for records other than steps and evaluations.
  MetricsLog& metrics() { return log_; }
  // Time spent outside steps (evaluation, saves) is not the interval's.
  void exclude_pause() { stage_.reset_gemm_seconds(); }

 private:
  const Deck& deck_;
  ProcessGrid& grid_;
  StageBackend& stage_;
  double flops_per_token_, rank_peak_, peak_flops_;
  // The schedule's bubble with equal stages and F = B = W (the textbook
  // (pp - 1) / (M + pp - 1) for GPipe and 1F1B, a third of 1F1B's for zb-h1).
  double bubble_theory_ = 0;
  int64_t intervals_ = 0;
  MetricsLog log_;
  StepTimes times_;
  double interval_s_ = 0;
  int64_t interval_steps_ = 0;
};

}  // namespace mpiformer
