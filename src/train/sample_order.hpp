// The order in which training windows are visited: a seeded permutation per
// epoch. Positions are global sample counts, so the same position names the
// same window whatever the number of ranks that read it.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace mpiformer {

// The permutation is computed, not stored: a keyed Feistel network over the
// smallest even number of bits that holds the window count, walked until
// it lands inside [0, num_windows) (at most a few steps on average, as the
// domain is less than 4x the count). Memory is constant whatever the
// dataset's size (a stored order took 8 bytes a window: 8 GB for a
// trillion-token file), and any position is found in O(1) without
// building its epoch.
class SampleOrder {
 public:
  // `stream` names the order: a blend's sources each have their own
  // ("sample_order/<name>"); a single source keeps the plain name.
  SampleOrder(int64_t num_windows, uint64_t seed, std::string stream = "sample_order");
  int64_t num_windows() const { return n_; }
  // The window at global sample position `pos` (epoch = pos / num_windows).
  int64_t window(int64_t pos);
  int64_t epoch(int64_t pos) const { return pos / n_; }

 private:
  static constexpr int kRounds = 6;
  uint64_t permute(uint64_t x) const;
  int64_t n_;
  uint64_t seed_;
  std::string stream_;
  int half_bits_ = 1;
  int64_t epoch_ = -1;
  std::array<uint64_t, kRounds> keys_{};  // this epoch's round keys
};

}  // namespace mpiformer
