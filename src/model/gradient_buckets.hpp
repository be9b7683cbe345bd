// How a stage's gradients travel to its data-parallel group at zero 0:
// buckets of whole tensors, and how many are in flight at once. The trainer
// (GradReducer) and the memory accounting (plan/rank_memory.hpp, which
// sizes MPI's temporaries from the largest) read them from here.
#pragma once
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/grad_compression.hpp"
#include "core/settings.hpp"
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
// All-reduces in flight at once on the host: a host MPI's non-blocking
// all-reduce holds a temporary as large as its bucket until it completes.
// Not on a device: NCCL holds none, and a wait there orders the compute
// stream after the reduction, so a bound would hold the backward behind
// the reductions two buckets back.
inline constexpr size_t kReductionsInFlight = 2;

// What the compressed all-reduce holds, in bytes, for a stage of
// `elements` cut into `buckets` over groups of `dp` (the experts' buckets:
// `expert_dp`): the residuals (every element, and the chunk each rank sums
// of each bucket) and two wire buffers of the largest bucket.
struct CompressionBuffers {
  int64_t residual = 0, summed = 0, wire = 0;
  double bytes() const { return 4.0 * static_cast<double>(residual + summed) + 2.0 * static_cast<double>(wire); }
};
inline CompressionBuffers compression_buffers(GradCompression kind,
                                              const std::vector<GradientBucket>& buckets,
                                              int64_t elements, int dp, int expert_dp) {
  CompressionBuffers b;
  if (kind == GradCompression::kNone) return b;
  b.residual = elements;
  for (const GradientBucket& k : buckets) {
    const int g = k.experts ? expert_dp : dp;
    const int64_t c = chunk_elements(k.end - k.begin, g);
    b.summed += c;
    b.wire = std::max(b.wire, g * compressed_chunk_bytes(kind == GradCompression::kInt8, c));
  }
  return b;
}

}  // namespace mpiformer
