// Which source of a blend each global training sample comes from.
//
// A pure function of (the weights, the sample's position), so every rank,
// layout and resume sees the same stream, and exact: after n samples, each
// source i has given c_i(n) samples with |c_i(n) - w_i n| < 1 for every n
// (w normalised to sum 1). Independent draws would be off by sqrt(n);
// Megatron's greedy "largest deficit first" is not bounded by one sample
// for more than two sources. This is Tijdeman's chairman assignment
// (1980): sample n goes to the source whose deadline comes first among
// those at least 1/(2k - 2) behind their share, which keeps every source
// within 1 - 1/(2k - 2) of it.
//
// The state is the counts alone, so the stream is walked, not stored:
// constant memory at any position; the trainer advances it a step's
// samples at a time and a checkpoint records the counts (a resume is O(k));
// seek() recomputes any position from the blend's start.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mpiformer {

class BlendOrder {
 public:
  // `weights` > 0 (normalised here). The blend starts at global sample
  // `start`, where source i had already given base[i] samples (a re-blend
  // carries each source's own position on; empty: all 0).
  explicit BlendOrder(const std::vector<double>& weights, int64_t start = 0,
                      std::vector<int64_t> base = {});

  struct Draw {
    int source;     // which source
    int64_t index;  // that source's own sample count before it (its cursor)
  };
  // The sample at position() and a step past it.
  Draw next();

  int64_t position() const { return position_; }
  int64_t start() const { return start_; }
  // Samples each source has given before position(), base included.
  const std::vector<int64_t>& counts() const { return counts_; }
  const std::vector<int64_t>& base() const { return base_; }
  const std::vector<double>& shares() const { return share_; }

  // To `position` (>= start) by walking from the start: O(k) per sample.
  void seek(int64_t position);
  // To a recorded state (a checkpoint's counts at `position`); "" when it is
  // one this blend can be at, otherwise why not.
  std::string restore(int64_t position, const std::vector<int64_t>& counts);

 private:
  std::vector<double> share_;
  double slack_;  // 1 / (2k - 2): how far behind a source must be to be drawn
  int64_t start_;
  std::vector<int64_t> base_, counts_;
  int64_t position_;
};

}  // namespace mpiformer
