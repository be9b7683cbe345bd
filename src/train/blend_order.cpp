#include "train/blend_order.hpp"

#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "core/format.hpp"

namespace mpiformer {

BlendOrder::BlendOrder(const std::vector<double>& weights, int64_t start, std::vector<int64_t> base)
    : start_(start), base_(std::move(base)), position_(start) {
  if (weights.empty()) throw std::invalid_argument("BlendOrder: no sources");
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  for (const double w : weights) {
    if (!(w > 0) || !std::isfinite(total)) throw std::invalid_argument("BlendOrder: weights must be > 0");
    share_.push_back(w / total);
  }
  const size_t k = weights.size();
  slack_ = k > 1 ? 1.0 / (2.0 * static_cast<double>(k) - 2.0) : 0.0;
  if (base_.empty()) base_.assign(k, 0);
  if (base_.size() != k) throw std::invalid_argument("BlendOrder: one base count per source");
  counts_ = base_;
}

BlendOrder::Draw BlendOrder::next() {
  // n: the number of this sample within the blend, from 1.
  const double n = static_cast<double>(position_ - start_ + 1);
  int pick = -1, behind_most = 0;
  double soonest = std::numeric_limits<double>::infinity(), most = -1;
  for (size_t i = 0; i < share_.size(); ++i) {
    const double given = static_cast<double>(counts_[i] - base_[i]);
    const double behind = share_[i] * n - given;
    if (behind > most) {
      most = behind;
      behind_most = static_cast<int>(i);
    }
    // The 1e-9 absorbs rounding in share * n (exact shares like 1/2 make
    // ties at the threshold common).
    if (behind < slack_ - 1e-9) continue;
    // When this source would fall a full 1 - slack behind its share.
    const double deadline = (given + 1.0 - slack_) / share_[i];
    if (deadline < soonest) {
      soonest = deadline;
      pick = static_cast<int>(i);
    }
  }
  // Some source is always eligible (the deficits sum to 1 >= k x slack);
  // the fallback only guards against rounding at huge positions.
  if (pick < 0) pick = behind_most;
  const Draw d{pick, counts_[static_cast<size_t>(pick)]};
  ++counts_[static_cast<size_t>(pick)];
  ++position_;
  return d;
}

void BlendOrder::seek(int64_t position) {
  if (position < start_) throw std::invalid_argument("BlendOrder::seek: before the blend's start");
  counts_ = base_;
  position_ = start_;
  while (position_ < position) next();
}

std::string BlendOrder::restore(int64_t position, const std::vector<int64_t>& counts) {
  if (counts.size() != share_.size())
    return strprintf("%zu counts for %zu sources", counts.size(), share_.size());
  if (position < start_)
    return strprintf("position %lld is before the blend's start %lld",
                     static_cast<long long>(position), static_cast<long long>(start_));
  int64_t sum = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t given = counts[i] - base_[i];
    const double off = static_cast<double>(given) - share_[i] * static_cast<double>(position - start_);
    if (given < 0 || std::fabs(off) >= 1.0)
      return strprintf("source %zu's count %lld is not within one sample of its share",
                       i + 1, static_cast<long long>(counts[i]));
    sum += given;
  }
  if (sum != position - start_)
    return strprintf("the counts sum to %lld samples, the position says %lld",
                     static_cast<long long>(sum), static_cast<long long>(position - start_));
  counts_ = counts;
  position_ = position;
  return "";
}

}  // namespace mpiformer
