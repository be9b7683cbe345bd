// The training data as a run's log and `plan` show it: each source's files,
// tokens, windows and weight, the epochs the run's samples will take of
// it, and a warning where that passes [data] warn_repeats.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/data_feeder.hpp"

namespace mpiformer {

// Lines to print (no trailing newline on each), for a run of `run_samples`
// global samples.
std::vector<std::string> data_summary(const DataFeeder& data, int64_t run_samples);
// One warning per source the run will see more than `warn_repeats` times.
std::vector<std::string> repeat_warnings(const DataFeeder& data, int64_t run_samples,
                                         int64_t warn_repeats);

}  // namespace mpiformer
