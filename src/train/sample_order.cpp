#include "train/sample_order.hpp"

#include <numeric>
#include <string>

#include "core/rng.hpp"

namespace mpiformer {

SampleOrder::SampleOrder(int64_t num_windows, uint64_t seed) : n_(num_windows), seed_(seed) {}

int64_t SampleOrder::window(int64_t pos) {
  const int64_t e = pos / n_;
  if (e != epoch_) build(e);
  return perm_[static_cast<size_t>(pos % n_)];
}

void SampleOrder::build(int64_t epoch) {
  perm_.resize(static_cast<size_t>(n_));
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  // Fisher-Yates with a stream keyed by (seed, epoch): any rank rebuilds any
  // epoch's order without replaying the ones before it.
  Rng rng(seed_, "sample_order/" + std::to_string(epoch));
  for (int64_t i = n_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
  }
  epoch_ = epoch;
}

}  // namespace mpiformer
