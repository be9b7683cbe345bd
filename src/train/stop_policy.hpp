// When a run stops early to be requeued: a stop signal (SIGUSR1 or SIGTERM,
// stop_request.hpp), or the deadline, the earlier of [run] time_limit and
// Slurm's end of job (SLURM_JOB_END_TIME). Every rank votes in each step's
// last all-reduce; the trainer stops after the step if any rank voted so.
#pragma once
#include <chrono>
#include <cstdint>

namespace mpiformer {

class StopPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  // `time_limit_s` 0: no limit of our own. `checkpoint_bytes`: what a save
  // of this rank's stage writes, for the guess before a save is measured.
  StopPolicy(double time_limit_s, int64_t checkpoint_bytes);

  // Before a step: true when the step, what may follow it and a save would
  // not all fit before the deadline, so the run must stop after this step.
  bool out_of_time(Clock::time_point now) const;
  // At the end of a step: this rank's vote (out of time, or a signal came).
  static bool vote(bool out_of_time);
  void step_took(double seconds);
  void eval_took(double seconds) { last_eval_s_ = seconds; }
  void save_took(double seconds) { last_save_s_ = seconds; }
  // Why a run stopped: "SIGUSR1", "SIGTERM" or "time limit".
  const char* reason() const;
  double deadline_s() const { return deadline_s_; }  // from the start; +inf: none

 private:
  Clock::time_point start_;
  double deadline_s_;
  int64_t checkpoint_bytes_;
  double total_step_s_ = 0, last_eval_s_ = 0, last_save_s_ = 0;
  int64_t steps_ = 0;
};

}  // namespace mpiformer
