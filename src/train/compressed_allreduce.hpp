// [train] grad_compression: zero 0's data-parallel all-reduce with the
// gradients compressed on the wire (bf16: half the bytes of float; int8
// with a float scale per 256: about a quarter), as DeepSpeed's 1-bit Adam
// compresses its all-reduce, and with its error feedback on both sides.
// Per bucket of n gradients, over a group of g ranks, rank r:
//   1. x = g + e (e: what this rank did not send of this bucket last
//      step); x goes out as g chunks, each compressed (Q), and e = x - Q(x);
//   2. an all-to-all: rank r receives every rank's chunk r;
//   3. rank r sums them in rank order with its own residual of chunk r,
//      s = sum_j D(Q_j) + e_r, compresses the sum, e_r = s - D(Q(s));
//   4. an all-gather of the compressed sums: every rank expands the same
//      bits, so the replicas' gradients stay identical (the update keeps
//      them so).
// Bytes each rank sends: 2 (g - 1) chunks, against 2 (g - 1) n / g floats
// for the ring all-reduce. The residuals carry over steps (and into
// checkpoints: a resume on the same layout continues exactly); they are
// per rank, so the numbers depend on dp, within what the compression
// loses (e2e.compression states it). A step whose update is skipped (a
// non-finite gradient) forgets them.
// On the host the exchange blocks (host MPI hides nothing anyway); on a
// GPU every part is ordered on the streams, and the host goes on.
#pragma once
#include <cstdint>
#include <vector>

#include "common/grad_compression.hpp"
#include "core/settings.hpp"
#include "model/gradient_buckets.hpp"
#include "parallel/communicator.hpp"
#include "train/grad_reducer.hpp"

namespace mpiformer {

template <class Ops>
class CompressedAllReduce final : public BucketReduction {
 public:
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;

  CompressedAllReduce(typename Ops::Context& ctx, GradCompression kind,
                      const std::vector<GradientBucket>& buckets, int64_t elements, int dp,
                      int expert_dp)
      : ctx_(ctx), int8_(kind == GradCompression::kInt8) {
    const CompressionBuffers b = compression_buffers(kind, buckets, elements, dp, expert_dp);
    residual_ = Buffer<float>(static_cast<size_t>(b.residual));
    summed_ = Buffer<float>(static_cast<size_t>(b.summed));
    for (auto& w : wire_) w = Buffer<uint8_t>(static_cast<size_t>(b.wire));
    int64_t at = 0;
    for (const GradientBucket& k : buckets) {
      summed_at_.push_back(at);
      at += chunk_elements(k.end - k.begin, k.experts ? expert_dp : dp);
    }
    forget();
  }

  // Bytes of its buffers, as allocated (the accounting's compression_buffers
  // must predict them).
  double allocated_bytes() const {
    return 4.0 * static_cast<double>(residual_.size() + summed_.size()) +
           static_cast<double>(wire_[0].size() + wire_[1].size());
  }

  void reduce(float* grads, int64_t begin, int64_t end, size_t bucket, Communicator& group) override {
    const int g = group.size(), r = group.rank();
    const int64_t n = end - begin, c = chunk_elements(n, g);
    const int64_t bytes = compressed_chunk_bytes(int8_, c);
    uint8_t* out = wire_[0].get();
    uint8_t* in = wire_[1].get();
    Ops::compress_with_feedback(ctx_, int8_, grads + begin, residual_.get() + begin, n, g, out);
    counts_.assign(static_cast<size_t>(g), bytes);
    group.alltoallv_bytes(out, counts_, in, counts_);
    const int64_t valid = std::max<int64_t>(0, std::min(c, n - r * c));
    Ops::sum_compressed(ctx_, int8_, in, g, c, valid, summed_.get() + summed_at_[bucket], out + r * bytes);
    // In place, as 16-bit units (bits, not values; chunks are whole words).
    halves_.assign(static_cast<size_t>(g), bytes / 2);
    group.start_allgather(out + r * bytes, out, halves_, 2)->wait();
    Ops::expand_compressed(ctx_, int8_, out, g, n, grads + begin);
    sent_ += 2.0 * static_cast<double>(bytes) * (g - 1);
  }
  double take_sent_bytes() override {
    const double s = sent_;
    sent_ = 0;
    return s;
  }
  // Residuals back to zero: a fresh run, a skipped update, a restore
  // under another layout.
  void forget() override {
    Ops::fill_zero(ctx_, residual_.get(), static_cast<int64_t>(residual_.size()));
    Ops::fill_zero(ctx_, summed_.get(), static_cast<int64_t>(summed_.size()));
  }
  // The residuals, for checkpoints: every element's, then the summed chunks'.
  std::vector<std::pair<float*, int64_t>> residuals() override {
    return {{residual_.get(), static_cast<int64_t>(residual_.size())},
            {summed_.get(), static_cast<int64_t>(summed_.size())}};
  }

 private:
  typename Ops::Context& ctx_;
  bool int8_;
  Buffer<float> residual_, summed_;
  Buffer<uint8_t> wire_[2];
  std::vector<int64_t> summed_at_, counts_, halves_;
  double sent_ = 0;
};

}  // namespace mpiformer
