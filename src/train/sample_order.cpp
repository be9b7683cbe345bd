#include "train/sample_order.hpp"

#include <string>

#include "core/rng.hpp"

namespace mpiformer {

SampleOrder::SampleOrder(int64_t num_windows, uint64_t seed, std::string stream)
    : n_(num_windows), seed_(seed), stream_(std::move(stream)) {
  while ((uint64_t{1} << (2 * half_bits_)) < static_cast<uint64_t>(n_)) ++half_bits_;
}

int64_t SampleOrder::window(int64_t pos) {
  const int64_t e = pos / n_;
  if (e != epoch_) {
    // A stream keyed by (seed, epoch): any rank finds any epoch's order
    // without replaying the ones before it.
    Rng rng(seed_, stream_ + "/" + std::to_string(e));
    for (auto& k : keys_) k = rng.next();
    epoch_ = e;
  }
  // Cycle walking: the network permutes [0, 4^half_bits); following it from
  // a point inside [0, n) until it is inside again permutes [0, n).
  uint64_t x = static_cast<uint64_t>(pos % n_);
  do x = permute(x);
  while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

uint64_t SampleOrder::permute(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (const uint64_t key : keys_) {
    uint64_t state = right ^ key;  // the round function: a full-avalanche mix
    const uint64_t f = splitmix64(state) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

}  // namespace mpiformer
