// Stragglers during the run ([run] straggler_every): every N steps the
// ranks' compute time per step is gathered: the step's time less its
// waits (pipeline receives; the data-parallel group's exposed reduction
// and any wait for it inside the passes, a free slot or ZeRO's gathers;
// the tensor and expert groups' exchanges). A rank whose compute time is
// above the median of the ranks doing the same work (its pipeline
// stage's: stages differ by design) by more than 1 / [run]
// health_fraction in two windows running is named with its host, in the
// log and in metrics.jsonl ("straggler"), for as long as it stays so.
// Host timings: a GPU run's host-side times are its launches', not its
// kernels', so it watches nothing yet.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "train/step_executor.hpp"

namespace mpiformer {

class StragglerWatch {
 public:
  // `every` steps a window (0: off); `active`: whether this run's host
  // timings mean anything (not a GPU run); `peers`: this rank's pipeline
  // stage (ranks are compared with their stage's others).
  StragglerWatch(MPI_Comm world, int64_t every, double fraction, bool active, int peers);
  // This rank's step of `seconds`, whose waits moved `before` to `after`
  // (the ProgressLog's counters around the step).
  void step_done(double seconds, const StepTimes& before, const StepTimes& after);
  // Collective at the end of every window (no-op between them): the ranks
  // named this window, as log lines (rank 0: every rank gets them) and
  // JSON records for metrics.jsonl.
  struct Finding {
    std::vector<std::string> lines, records;
  };
  Finding window_end(int64_t step);

 private:
  MPI_Comm world_;
  int64_t every_;
  double fraction_;
  bool active_;
  int rank_ = 0, size_ = 1;
  std::vector<std::string> hosts_;
  std::vector<int> peers_;  // per rank: its stage
  std::vector<int> slow_windows_;  // per rank: windows in a row above the bound
  double compute_ = 0;
  int64_t steps_ = 0;
};

}  // namespace mpiformer
