#include "train/grad_reducer.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

namespace mpiformer {

GradReducer::GradReducer(const ParameterTable& table, double bucket_bytes, Communicator& dp,
                         Communicator* experts, bool bounded)
    : dp_(dp), experts_(experts != nullptr ? *experts : dp), bounded_(bounded) {
  for (const GradientBucket& b : gradient_buckets(table, bucket_bytes)) buckets_.push_back(b);
}

void GradReducer::begin(float* grads) {
  grads_ = grads;
  held_ = 0;
  next_ = 0;
  pending_.clear();
}

void GradReducer::grads_final_from(int64_t offset) {
  while (next_ < buckets_.size() && buckets_[next_].begin >= offset) {
    const Bucket& b = buckets_[next_++];
    if (reduction_ != nullptr) {
      reduction_->reduce(grads_, b.begin, b.end, next_ - 1, b.experts ? experts_ : dp_);
      continue;
    }
    if (bounded_ && pending_.size() >= kReductionsInFlight) {
      // Backward stands still here as at the end: exposed too (else a
      // rank waiting on a slow peer here reads as computing).
      held_ += pending_.front()->timed_wait();
      pending_.erase(pending_.begin());
    }
    Communicator& group = b.experts ? experts_ : dp_;
    pending_.push_back(group.start_allreduce_sum(grads_ + b.begin, b.end - b.begin));
    if (started_) started_(b.begin, b.end, *pending_.back());
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
  return std::exchange(held_, 0.0) +
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace mpiformer
