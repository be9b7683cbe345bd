// What a run leaves in its run directory besides metrics and checkpoints:
// the transport tuning it ran under (recorded at the start of each launch)
// and the `finished` marker, the job scripts' only proof that a launch
// reached its last step (an exit status of 0 is not: a launcher that failed
// to start the ranks has been seen to return 0).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mpiformer {

// The NCCL_*, UCX_* and OMPI_MCA_* variables of this process's environment,
// sorted by name, without those mpirun sets for its own bookkeeping (they
// describe the launch, not a choice), and the NCCL version where a GPU back
// end runs ("" otherwise).
struct LaunchEnvironment {
  std::vector<std::pair<std::string, std::string>> vars;
  std::string nccl;
};
LaunchEnvironment launch_environment(bool gpu);
// {"environment": {"NCCL_DEBUG": "INFO", ...}[, "nccl": "2.21.5"]}
std::string environment_json(const LaunchEnvironment& env);
// One line for the log header, "env:   NAME=value ...".
std::string environment_line(const LaunchEnvironment& env);

// The marker's path in `run_dir`.
std::string finished_marker(const std::string& run_dir);
// Removes a marker an earlier launch left (a resumed run has not finished
// until it says so again). Throws SystemError when it cannot.
void clear_finished(const std::string& run_dir);
// Writes the marker durably: "finished step N of M (run ID)\n", where N is
// the step this launch ended at (train.stop_at ends a segment before M).
void mark_finished(const std::string& run_dir, int64_t step, int64_t steps,
                   const std::string& run_id);

}  // namespace mpiformer
