// A fixed table of entries that code under a lock adds and removes and a
// signal handler reads without a lock or an allocation (a slot's `used`
// flag is published last, with release order): the registries a handler
// consults as the process ends (mapped_regions.hpp, exit_cleanup.hpp).
#pragma once
#include <atomic>
#include <mutex>

namespace mpiformer {

template <class T, int N>
class SignalSafeTable {
 public:
  // `fill(T&)` sets a free slot's entry; false when the table is full.
  template <class Fill>
  bool add(Fill fill) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (Slot& s : slots_) {
      if (s.used.load(std::memory_order_relaxed)) continue;
      fill(s.value);
      s.used.store(true, std::memory_order_release);
      return true;
    }
    return false;
  }
  template <class Match>
  void remove_if(Match match) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (Slot& s : slots_)
      if (s.used.load(std::memory_order_relaxed) && match(s.value))
        s.used.store(false, std::memory_order_release);
  }
  // Async-signal-safe: no lock, no allocation.
  template <class F>
  void for_each(F f) const {
    for (const Slot& s : slots_)
      if (s.used.load(std::memory_order_acquire)) f(s.value);
  }

 private:
  struct Slot {
    std::atomic<bool> used{false};
    T value{};
  };
  Slot slots_[N];
  std::mutex mutex_;
};

}  // namespace mpiformer
