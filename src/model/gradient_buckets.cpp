#include "model/gradient_buckets.hpp"

#include <algorithm>

namespace mpiformer {

std::vector<GradientBucket> gradient_buckets(const ParameterTable& table, double bucket_bytes) {
  // Tensor boundaries, highest offset first; a bucket closes once it holds
  // bucket_bytes, or before a tensor of the other kind (an expert's or
  // not). It ends where the tensor after it begins, so the alignment gaps
  // travel too (zeros, and one contiguous range per bucket).
  std::vector<std::pair<int64_t, bool>> starts;
  for (const auto& s : table.specs()) starts.push_back({s.offset, s.expert >= 0});
  std::sort(starts.rbegin(), starts.rend());
  std::vector<GradientBucket> buckets;
  int64_t end = table.total_storage(), open = end;  // open: the open bucket's lowest start
  bool kind = false;
  for (const auto& [start, experts] : starts) {
    if (open < end && experts != kind) {
      buckets.push_back({open, end, kind});
      end = open;
    }
    open = start;
    kind = experts;
    if (static_cast<double>(end - start) * sizeof(float) >= bucket_bytes || start == 0) {
      buckets.push_back({start, end, experts});
      end = open = start;
    }
  }
  return buckets;
}

}  // namespace mpiformer
