#include "model/gradient_buckets.hpp"

#include <algorithm>

namespace mpiformer {

std::vector<std::pair<int64_t, int64_t>> gradient_buckets(const ParameterTable& table,
                                                          double bucket_bytes) {
  // Tensor boundaries, highest offset first; a bucket closes once it holds
  // bucket_bytes. It ends where the tensor after it begins, so the alignment
  // gaps travel too (zeros, and one contiguous range per bucket).
  std::vector<int64_t> starts;
  for (const auto& s : table.specs()) starts.push_back(s.offset);
  std::sort(starts.rbegin(), starts.rend());
  std::vector<std::pair<int64_t, int64_t>> buckets;
  int64_t end = table.total_storage();
  for (int64_t start : starts) {
    if (static_cast<double>(end - start) * sizeof(float) >= bucket_bytes || start == 0) {
      buckets.emplace_back(start, end);
      end = start;
    }
  }
  return buckets;
}

}  // namespace mpiformer
