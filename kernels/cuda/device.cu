#include "core/cuda_check.hpp"
#include "cuda/device.hpp"

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

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void device_free(void* p) noexcept {
  if (p != nullptr) cudaFree(p);
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
