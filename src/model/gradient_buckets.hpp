// How a stage's gradients travel to its data-parallel group at zero 0:
// buckets of whole tensors, and how many are in flight at once. The trainer
// (GradReducer) and the memory accounting (plan/rank_memory.hpp, which
// sizes MPI's temporaries from the largest) read them from here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/parameter_table.hpp"

namespace mpiformer {

// The buckets [begin, end) of a stage's flat buffer, from its end to its
// start (what GradReducer reduces; the memory accounting sizes MPI's
// temporaries from the largest). A bucket holds experts' tensors only or
// none (`experts`): under expert parallelism they are reduced over another
// group than the rest.
struct GradientBucket {
  int64_t begin = 0, end = 0;
  bool experts = false;
};
std::vector<GradientBucket> gradient_buckets(const ParameterTable& table, double bucket_bytes);
// All-reduces in flight at once: a host MPI's non-blocking all-reduce
// holds a temporary as large as its bucket until it completes. On a GPU a
// wait only orders streams, so the bound costs nothing there.
inline constexpr size_t kReductionsInFlight = 2;

}  // namespace mpiformer
