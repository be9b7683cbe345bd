#include "train/grad_reducer.hpp"

#include <algorithm>
#include <chrono>

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

GradReducer::GradReducer(const ParameterTable& table, double bucket_bytes, Communicator& dp)
    : dp_(dp) {
  for (const auto& [begin, end] : gradient_buckets(table, bucket_bytes)) buckets_.push_back({begin, end});
}

void GradReducer::begin(float* grads) {
  grads_ = grads;
  next_ = 0;
  pending_.clear();
}

void GradReducer::grads_final_from(int64_t offset) {
  while (next_ < buckets_.size() && buckets_[next_].begin >= offset) {
    const Bucket& b = buckets_[next_++];
    if (pending_.size() >= kReductionsInFlight) {
      pending_.front()->wait();
      pending_.erase(pending_.begin());
    }
    pending_.push_back(dp_.start_allreduce_sum(grads_ + b.begin, b.end - b.begin));
  }
  // MPI progresses non-blocking collectives only inside MPI calls: poke the
  // ones in flight so they advance while backward computes.
  for (auto& p : pending_) p->test();
}

double GradReducer::finish() {
  grads_final_from(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& p : pending_) p->wait();
  pending_.clear();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace mpiformer
