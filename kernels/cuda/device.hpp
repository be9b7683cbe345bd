// GPU discovery and device memory, usable from plain C++ translation units.
#pragma once
#include <cstddef>
#include <string>
#include <utility>

namespace mpiformer::cuda {

// Number of usable GPUs; 0 when there is no driver or no device (never
// throws), with the reason in *why.
int device_count(std::string* why = nullptr);

// Free memory of GPU `gpu` now (makes it the current device).
size_t device_free_bytes(int gpu);

void* device_alloc(size_t bytes);
// The most bytes device_alloc had handed out at once (this process).
size_t device_allocated_peak();
// What device_alloc has handed out and not taken back, now.
size_t device_allocated_now();
void device_free(void* p) noexcept;
// While one lives, allocations do not raise device_allocated_peak: for
// measurements that are not the run's memory (the peak-FLOPs GEMM's
// operands), which the memory report would otherwise count against the
// accounting. Allocations made under it must be freed before it ends.
class PeakExcluded {
 public:
  PeakExcluded();
  ~PeakExcluded();
  PeakExcluded(const PeakExcluded&) = delete;
  PeakExcluded& operator=(const PeakExcluded&) = delete;

 private:
  size_t saved_peak_;
};
void* pinned_alloc(size_t bytes);

// Device memory a kernel may use for the duration of its launches on one
// stream (the cuBLASLt workspace between GEMMs: Blas::scratch).
struct DeviceScratch {
  void* data = nullptr;
  size_t bytes = 0;
};
void pinned_free(void* p) noexcept;

// Move-only owner of an allocation made by Alloc and released by Free (which
// never throws).
template <class T, void* (*Alloc)(size_t), void (*Free)(void*) noexcept>
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  explicit OwnedBuffer(size_t n) : ptr_(static_cast<T*>(Alloc(n * sizeof(T)))), n_(n) {}
  ~OwnedBuffer() { Free(ptr_); }
  OwnedBuffer(OwnedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  OwnedBuffer& operator=(OwnedBuffer&& o) noexcept {
    if (this != &o) {
      Free(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Device memory.
template <class T>
using DeviceBuffer = OwnedBuffer<T, device_alloc, device_free>;
// Page-locked host memory: a copy from it is truly asynchronous (a copy from
// pageable memory returns only once the source has been staged, and waits
// for the stream to drain first).
template <class T>
using PinnedBuffer = OwnedBuffer<T, pinned_alloc, pinned_free>;

}  // namespace mpiformer::cuda
