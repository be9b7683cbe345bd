// `mpiformer calibrate`'s memory measurements on the host back end: what a
// process holds beyond the memory accounting (a real stage run forward and
// backward, a real collective checkpoint write), and the stage's time
// against the sum of its kernels timed alone (its stage factor).
#pragma once
#include <cstdint>
#include <string>

#include "core/gpt_config.hpp"
#include "core/settings.hpp"

namespace mpiformer::calibration {

// What a checkpoint save holds beyond the stage (parallel HDF5's and
// MPI-IO's buffers), from a real collective write of `bytes` of floats
// into `path` (removed after): the most any rank's peak rose. Collective.
double save_overhead(const std::string& path, double bytes);

// A real stage (the model's blocks with the embedding and the head, as
// many as a quarter of this rank's share of the node's memory holds) run
// forward and backward: seconds per micro-batch, and what this process
// holds beyond the stage's accounting once it has run (the BLAS library's
// buffers and primitives, the allocator's slack) over `baseline`, earlier
// probes' primitives dropped first. Collective.
struct StageProbe {
  GptConfig cfg;  // as probed
  int64_t micro_batch = 0;
  Recompute recompute = Recompute::kNone;
  double seconds = 0, overhead = 0;
};
StageProbe probe_stage(const GptConfig& model, int64_t micro_batch, Recompute recompute,
                       double baseline, double budget);

}  // namespace mpiformer::calibration
