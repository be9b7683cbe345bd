#include "train/stop_policy.hpp"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <limits>

#include "train/stop_request.hpp"

namespace mpiformer {

namespace {

// Before the first save is measured, a save is assumed to write at 100 MB/s:
// below what a local disk or a parallel file system gives a job (measured
// here: 358 MB/s, bench/RESULTS.md), so the guess errs towards stopping
// early rather than being killed mid-save.
constexpr double kAssumedSaveBytesPerSecond = 1e8;
// Steps vary by about 10% from one to the next on a shared machine
// (bench/RESULTS.md); the budget gets twice that on top.
constexpr double kMargin = 1.2;

}  // namespace

StopPolicy::StopPolicy(double time_limit_s, int64_t checkpoint_bytes)
    : start_(Clock::now()),
      deadline_s_(time_limit_s > 0 ? time_limit_s : std::numeric_limits<double>::infinity()),
      checkpoint_bytes_(checkpoint_bytes) {
  if (const char* end = std::getenv("SLURM_JOB_END_TIME")) {
    const double at = std::atof(end);  // seconds since the epoch
    if (at > 0) deadline_s_ = std::min(deadline_s_, at - static_cast<double>(std::time(nullptr)));
  }
}

void StopPolicy::step_took(double seconds) {
  total_step_s_ += seconds;
  ++steps_;
}

bool StopPolicy::vote(bool out_of_time) { return out_of_time || stop_requested(); }

bool StopPolicy::out_of_time(Clock::time_point now) const {
  const double mean_step = steps_ > 0 ? total_step_s_ / static_cast<double>(steps_) : 0.0;
  // After the step may come an evaluation (as long as the last one took) or
  // the log; at least one more step's time is kept in reserve for them.
  const double reserve = std::max(mean_step, last_eval_s_);
  const double save = last_save_s_ > 0
                          ? last_save_s_
                          : static_cast<double>(checkpoint_bytes_) / kAssumedSaveBytesPerSecond;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  return elapsed + kMargin * (mean_step + reserve + save) > deadline_s_;
}

const char* StopPolicy::reason() const {
  return stop_requested() ? stop_cause() : "time limit";
}

}  // namespace mpiformer
