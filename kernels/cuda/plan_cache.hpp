// The cuBLASLt plans' bookkeeping, pure C++ (tested on the CPU,
// tests/unit/test_gemm_layout.cpp): a least-recently-used map of bounded
// size, and the row buckets whose algorithm a GEMM of varying rows shares.
//
// A Mixture of Experts multiplies each expert's rows, a count that changes
// every step: one plan per count grew without bound and queried cuBLASLt's
// heuristic (tens of microseconds) for every new count. Plans (descriptors
// of the exact shape) now live in an LRU; the algorithm is chosen once per
// bucket of rows, for the bucket's largest count (so the choice depends on
// the shape alone, never on which counts came first: a resumed run picks
// what the uninterrupted one did).
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <utility>

namespace mpiformer::cuda {

// The top of m's bucket: m rounded up to a multiple of 2^(floor(log2 m) -
// 3), eight buckets an octave (at most 12.5% more rows than m). Counts that
// are multiples of their octave's eighth (every power of two, B x T in
// practice) are their own bucket.
inline int64_t gemm_rows_bucket(int64_t m) {
  if (m <= 16) return m;
  int log2 = 0;
  while ((int64_t{2} << log2) <= m) ++log2;  // 2^log2 <= m < 2^(log2+1)
  const int64_t unit = int64_t{1} << (log2 - 3);
  return (m + unit - 1) / unit * unit;
}

// At most `capacity` entries; the least recently found or inserted goes
// first, handed to `evicted` (which releases what the value holds).
template <class K, class V>
class LruMap {
 public:
  LruMap(size_t capacity, std::function<void(V&)> evicted)
      : capacity_(capacity), evicted_(std::move(evicted)) {}
  ~LruMap() {
    for (auto& kv : order_) evicted_(kv.second);
  }
  LruMap(const LruMap&) = delete;
  LruMap& operator=(const LruMap&) = delete;

  // The value, now the most recent; null when absent.
  V* find(const K& k) {
    const auto it = index_.find(k);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  V& insert(const K& k, V v) {
    if (order_.size() >= capacity_) {
      evicted_(order_.back().second);
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    order_.emplace_front(k, std::move(v));
    index_[k] = order_.begin();
    return order_.front().second;
  }
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::function<void(V&)> evicted_;
  std::list<std::pair<K, V>> order_;
  std::map<K, typename std::list<std::pair<K, V>>::iterator> index_;
};

}  // namespace mpiformer::cuda
