// The order in which training windows are visited: a seeded permutation per
// epoch. Positions are global sample counts, so the same position names the
// same window whatever the number of ranks that read it.
#pragma once
#include <cstdint>
#include <vector>

namespace mpiformer {

class SampleOrder {
 public:
  SampleOrder(int64_t num_windows, uint64_t seed);
  int64_t num_windows() const { return n_; }
  // The window at global sample position `pos` (epoch = pos / num_windows).
  int64_t window(int64_t pos);
  int64_t epoch(int64_t pos) const { return pos / n_; }

 private:
  void build(int64_t epoch);
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace mpiformer
