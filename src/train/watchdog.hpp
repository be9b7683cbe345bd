// The watchdog: a rank that is alive but stuck (a hung file system, a
// deadlocked or stopped peer, a collective whose peer died) ends the job
// with a report instead of waiting for the batch system's time limit.
//
// The training thread marks each phase it enters (an action of the
// schedule, an evaluation, a save) with what it waits on; this costs a lock
// and a few stores. A monitor thread fires when one phase has lasted longer
// than its limit. A writer thread publishes the phase as a heartbeat file
// <run.dir>/heartbeat/rank-<N> every few seconds, so the rank that fires
// can say what every rank last did, including one that went silent, even
// though no collective can run any more. On firing the rank prints what it
// waits on and every rank's last progress, then ends the process with
// kExitWatchdog; the launcher (mpirun, srun --kill-on-bad-exit) then ends
// the others. The monitor never touches the file system before it has
// printed its own line: a hung file system must not hang the watchdog.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mpiformer {

// "Stuck: ended by the watchdog". The Slurm script requeues it a bounded
// number of times (a bad node is likely not given again).
constexpr int kExitWatchdog = 76;

class Watchdog {
 public:
  // limit_s > 0: every phase may last that long. 0: automatic, the larger
  // of kMinAutoLimit and kAutoStepFactor x the median step time so far.
  Watchdog(double limit_s, const std::string& run_dir, int rank, int world);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The training thread enters a phase: `what` it does, at `step`, waiting
  // for `peer` (empty: computing). `allowance_s` > 0 raises the limit for
  // this phase (a save of many gigabytes).
  void enter(const std::string& what, int64_t step, const std::string& peer,
             double allowance_s = 0);
  // A step finished in `seconds` (for the automatic limit).
  void step_took(double seconds);
  // The limit a phase gets now, before any allowance.
  double limit() const;

  static constexpr double kMinAutoLimit = 300;
  static constexpr double kAutoStepFactor = 10;

 private:
  using Clock = std::chrono::steady_clock;
  struct Phase {
    std::string what, peer;
    int64_t step = 0;
    double allowance = 0;
    Clock::time_point since;
  };
  void monitor();
  void publish();
  [[noreturn]] void fire(const Phase& p, double waited, double limit);
  std::string heartbeat_line(const Phase& p) const;

  const double fixed_limit_;
  const std::string dir_;
  const int rank_, world_;
  std::string host_;
  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  Phase phase_;
  std::vector<double> step_times_;
  std::thread monitor_, writer_;
};

}  // namespace mpiformer
