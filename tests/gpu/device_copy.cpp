#include "device_copy.hpp"

#include <cuda_runtime.h>

#include "core/cuda_check.hpp"

namespace mpiformer::cuda {

// Each waits for all work on the device first (streams of any kind) and
// is complete on return.
void copy_to_device(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace mpiformer::cuda
