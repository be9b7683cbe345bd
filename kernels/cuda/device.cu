#include "core/cuda_check.hpp"
#include "cuda/device.hpp"

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace mpiformer::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device";
  return n;
}

size_t device_free_bytes(int gpu) {
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaSetDevice(gpu));
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

namespace {
// What device_alloc has handed out: the memory accounting's measured side.
std::mutex g_alloc_mutex;
std::unordered_map<void*, size_t> g_sizes;
size_t g_current = 0, g_peak = 0;
}  // namespace

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  g_sizes[p] = bytes;
  g_current += bytes;
  g_peak = std::max(g_peak, g_current);
  return p;
}

void device_free(void* p) noexcept {
  if (p == nullptr) return;
  cudaFree(p);
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  const auto it = g_sizes.find(p);
  if (it == g_sizes.end()) return;
  g_current -= it->second;
  g_sizes.erase(it);
}

size_t device_allocated_peak() {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  return g_peak;
}

size_t device_allocated_now() {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  return g_current;
}

PeakExcluded::PeakExcluded() {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  saved_peak_ = g_peak;
}

PeakExcluded::~PeakExcluded() {
  std::lock_guard<std::mutex> lock(g_alloc_mutex);
  g_peak = std::max(saved_peak_, g_current);
}

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}

void pinned_free(void* p) noexcept {
  if (p != nullptr) cudaFreeHost(p);
}

}  // namespace mpiformer::cuda
