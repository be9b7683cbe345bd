#include "train/progress_log.hpp"

#include <algorithm>

#include "core/test_hooks.hpp"
#include "parallel/schedule_timing.hpp"
#include "plan/memory_report.hpp"

namespace mpiformer {

ProgressLog::ProgressLog(const Deck& deck, ProcessGrid& grid, StageBackend& stage,
                         double flops_per_token, double rank_peak, double peak_flops,
                         bool append)
    : deck_(deck),
      grid_(grid),
      stage_(stage),
      flops_per_token_(flops_per_token),
      rank_peak_(rank_peak),
      peak_flops_(peak_flops),
      log_(deck.run.dir, grid.world_rank() == 0, append) {
  stage_.reset_gemm_seconds();
  const int pp = grid.pp(), micro = static_cast<int>(deck.grad_accum());
  // Equal stages, F = B = W; interleaved, each chunk's pass a v-th of that.
  const int v = static_cast<int>(deck.parallel.virtual_stages);
  const double pass = 1.0 / v;
  ActionCosts equal;
  equal.forward.assign(static_cast<size_t>(pp * v), pass);
  equal.backward.assign(static_cast<size_t>(pp * v), pass);
  equal.weights.assign(static_cast<size_t>(pp * v), pass);
  equal.reduce.assign(pp, 0.0);
  bubble_theory_ = simulate_step(deck.parallel.schedule, pp, micro, equal, v).idle_fraction();
}

void ProgressLog::step_done(int64_t done, int64_t end_step, double step_s, const StepResult& r,
                            int64_t samples) {
  interval_s_ += step_s;
  ++interval_steps_;
  const TrainConfig& tc = deck_.train;
  // A step whose update was not applied is always logged.
  const bool not_applied = r.verdict != StepVerdict::kApply;
  if (done % tc.log_every != 0 && done != end_step && !not_applied) return;
  // Means over the interval and over ranks (one small all-reduce), and
  // whether any rank's MFU would read above 100%.
  const double tokens_per_step = static_cast<double>(tc.global_batch * deck_.model.seq_len);
  const double rank_mfu =
      tokens_per_step / (interval_s_ / static_cast<double>(interval_steps_)) * flops_per_token_ /
      peak_flops_;
  double agg[12] = {times_.recv_wait / interval_s_, times_.reduce_exposed, times_.dp_sent_bytes,
                    times_.tp_reduce / interval_s_, times_.tp_sent_bytes, rank_mfu > 1 ? 1.0 : 0.0,
                    times_.optimizer, times_.ep_exchange, times_.ep_sent_bytes, times_.cp_ring,
                    times_.cp_ring - times_.cp_arithmetic, times_.cp_sent_bytes};
  grid_.world().allreduce_sum(agg, 12);
  ++intervals_;
  const double gemm_s = stage_.gemm_seconds();
  if (rank_peak_ > 0 && (agg[5] > 0 || intervals_ % kRemeasureEvery == 0)) {
    // Collective: every rank reaches this with the same verdict.
    rank_peak_ = std::max(rank_peak_,
                          excluding_from_peak([&] { return stage_.measure_peak_flops(); }));
    double sum = rank_peak_;
    grid_.world().allreduce_sum(&sum, 1);
    peak_flops_ = sum;
    exclude_pause();
  }
  const int ranks = grid_.dp() * grid_.pp() * grid_.tp();
  const double mean_s = interval_s_ / static_cast<double>(interval_steps_);
  StepMetrics sm;
  sm.step = done;
  sm.steps = tc.steps;
  sm.loss = r.loss;
  sm.lr = r.lr;
  sm.grad_norm = r.grad_norm;
  sm.step_ms = 1e3 * mean_s;
  sm.tokens_per_s = static_cast<double>(tc.global_batch * deck_.model.seq_len) / mean_s;
  // Still above the best measured peak: the machine did that much, so that
  // is its peak (the logging rank's figure; the MFU then reads 100%).
  peak_flops_ = std::max(peak_flops_, sm.tokens_per_s * flops_per_token_);
  sm.mfu = sm.tokens_per_s * flops_per_token_ / peak_flops_;
  sm.eta_s = mean_s * static_cast<double>(end_step - done);
  sm.samples = samples;
  sm.matmul_fraction = gemm_s / interval_s_;
  sm.pipelined = grid_.pp() > 1;
  sm.bubble = agg[0] / ranks;
  sm.bubble_theory = bubble_theory_;
  sm.data_parallel = grid_.dp() > 1;
  sm.reduce_exposed_ms = 1e3 * agg[1] / ranks / static_cast<double>(interval_steps_);
  sm.dp_sent_mb = agg[2] / 1e6 / ranks / static_cast<double>(interval_steps_);
  sm.tensor_parallel = grid_.tp() > 1;
  sm.tp_reduce_fraction = agg[3] / ranks;
  sm.tp_sent_mb = agg[4] / 1e6 / ranks / static_cast<double>(interval_steps_);
  sm.optimizer_ms = 1e3 * agg[6] / ranks / static_cast<double>(interval_steps_);
  sm.expert_parallel = grid_.ep() > 1;
  sm.ep_alltoall_ms = 1e3 * agg[7] / ranks / static_cast<double>(interval_steps_);
  sm.ep_sent_mb = agg[8] / 1e6 / ranks / static_cast<double>(interval_steps_);
  sm.context_parallel = grid_.cp() > 1;
  sm.cp_ring_ms = 1e3 * agg[9] / ranks / static_cast<double>(interval_steps_);
  sm.cp_wait_ms = 1e3 * agg[10] / ranks / static_cast<double>(interval_steps_);
  sm.cp_sent_mb = agg[11] / 1e6 / ranks / static_cast<double>(interval_steps_);
  // GPU runs time nothing on the host (their kernels run asynchronously);
  // a rehearsal of the GPU suite on the host reports the same keys.
  sm.host_timings = !stage_.on_device() && !test_hooks::rehearse_gpu();
  if (r.verdict == StepVerdict::kSkip) sm.skipped = r.why;
  if (r.verdict == StepVerdict::kStop) sm.stopped = r.why;
  sm.skipped_steps = r.skipped_steps;
  sm.loss_scaling = r.loss_scaling;
  sm.overflow = r.overflow;
  sm.loss_scale = r.loss_scale;
  sm.overflows = r.overflows;
  sm.moe = r.moe;
  sm.aux_loss = r.aux_loss;
  sm.z_loss = r.z_loss;
  sm.dropped = r.dropped;
  sm.load_min = r.load_min;
  sm.load_max = r.load_max;
  log_.step(sm);
  stage_.reset_gemm_seconds();
  interval_s_ = 0;
  interval_steps_ = 0;
  times_ = StepTimes{};
}

void ProgressLog::eval_done(int64_t done, double val_loss,
                            const std::vector<std::pair<std::string, double>>& per_source) {
  log_.eval(done, deck_.train.steps, val_loss, per_source);
}

}  // namespace mpiformer
