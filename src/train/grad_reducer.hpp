// Data-parallel gradient reduction in buckets, overlapped with backward.
// The flat gradient buffer is cut, from its end, into buckets of about
// bucket_bytes at tensor boundaries (backward finishes tensors from the end
// of the buffer to its start). During the last micro-batch's backward, each
// bucket's all-reduce starts as soon as all its gradients are final; the
// wait left at the end is the reduction time backward did not hide. Under
// expert parallelism the experts' buckets are all-reduced over the ranks
// holding the same experts (`experts`), the rest over the whole group.
#pragma once
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "model/gradient_buckets.hpp"
#include "model/parameter_table.hpp"
#include "parallel/communicator.hpp"

namespace mpiformer {

// A bucket's reduction done otherwise than by the float all-reduce
// (compressed_allreduce.hpp), in the bucket's turn: the sum over `group`
// lands in grads[begin, end) on every rank, ordered before what follows
// on the device (a GPU) or done on return (the host).
class BucketReduction {
 public:
  virtual ~BucketReduction() = default;
  virtual void reduce(float* grads, int64_t begin, int64_t end, size_t bucket,
                      Communicator& group) = 0;
  // Bytes this rank sent since the last call.
  virtual double take_sent_bytes() = 0;
  // State carried from step to step (error feedback's residuals): back
  // to zero, and where it lives (device memory on a GPU), for checkpoints.
  virtual void forget() = 0;
  virtual std::vector<std::pair<float*, int64_t>> residuals() = 0;
};

class GradReducer {
 public:
  // `bounded`: at most kReductionsInFlight all-reduces at once (host MPI,
  // which holds a temporary of each); on a device none is waited for
  // before finish(), as a wait there holds the backward behind it.
  GradReducer(const ParameterTable& table, double bucket_bytes, Communicator& dp,
              Communicator* experts = nullptr, bool bounded = true);

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  // Every bucket through `r` instead of the float all-reduce (null: back).
  void reduce_with(BucketReduction* r) { reduction_ = r; }
  // Before the last micro-batch's backward.
  void begin(float* grads);
  // Every gradient at offsets >= offset is final: start the buckets it completes.
  void grads_final_from(int64_t offset);
  // Starts whatever is left, waits for all; returns the seconds spent
  // waiting, here and for a free slot (kReductionsInFlight) since begin().
  double finish();
  // Called as each bucket's reduction starts, with its offsets and its
  // operation (the offloaded optimizer copies the bucket to the host once
  // the operation is done on the device).
  using Started = std::function<void(int64_t begin, int64_t end, PendingOp& op)>;
  void on_bucket_started(Started started) { started_ = std::move(started); }

 private:
  using Bucket = GradientBucket;
  std::vector<Bucket> buckets_;  // from the end of the buffer to its start
  Communicator& dp_;
  Communicator& experts_;
  float* grads_ = nullptr;
  size_t next_ = 0;
  std::vector<Pending> pending_;
  bool bounded_ = true;
  double held_ = 0;  // seconds backward waited for a reduction's slot
  Started started_;
  BucketReduction* reduction_ = nullptr;
};

}  // namespace mpiformer
