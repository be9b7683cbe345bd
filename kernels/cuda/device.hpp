// GPU discovery and device memory, usable from plain C++ translation units.
#pragma once
#include <cstddef>
#include <string>
#include <utility>

namespace mpiformer::cuda {

// Number of usable GPUs; 0 when there is no driver or no device (never
// throws), with the reason in *why.
int device_count(std::string* why = nullptr);

void* device_alloc(size_t bytes);
void device_free(void* p) noexcept;
void* pinned_alloc(size_t bytes);
void pinned_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_device_to_device(void* dst, const void* src, size_t bytes);
// Waits for all work on the current device.
void synchronize();

// Move-only owner of a device allocation; its deleter never throws.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : ptr_(static_cast<T*>(device_alloc(n * sizeof(T)))), n_(n) {}
  ~DeviceBuffer() { device_free(ptr_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      device_free(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

}  // namespace mpiformer::cuda
