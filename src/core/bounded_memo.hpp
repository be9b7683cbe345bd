// What the planner builds once and looks up many times while a search
// prices tens of thousands of layouts: a stage's tables, a pipeline's
// schedules, their compiled form. Bounded in entries and bytes (the whole
// memo is dropped when the next entry would pass either; a search meets its
// keys in runs), safe from several threads. Two threads missing the same key
// both build it; the first kept is what later lookups get, and both results
// are equal.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace mpiformer {

template <class Key, class Value>
class BoundedMemo {
 public:
  BoundedMemo(size_t max_entries, double max_bytes)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}

  // The value of `key`: remembered, or make() and remembered when
  // bytes(value) fits the bound at all.
  template <class Make, class Bytes>
  std::shared_ptr<const Value> get(const Key& key, const Make& make, const Bytes& bytes) {
    {
      const std::lock_guard<std::mutex> hold(lock_);
      if (auto it = known_.find(key); it != known_.end()) return it->second;
    }
    std::shared_ptr<const Value> built = make();
    const double size = bytes(*built);
    const std::lock_guard<std::mutex> hold(lock_);
    if (known_.size() >= max_entries_ || held_ + size > max_bytes_) {
      known_.clear();
      held_ = 0;
    }
    if (size <= max_bytes_ && known_.emplace(key, built).second) held_ += size;
    return built;
  }

 private:
  const size_t max_entries_;
  const double max_bytes_;
  std::mutex lock_;
  std::map<Key, std::shared_ptr<const Value>> known_;
  double held_ = 0;
};

}  // namespace mpiformer
