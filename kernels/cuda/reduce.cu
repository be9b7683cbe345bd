#include <algorithm>

#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/reduce.hpp"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 256;

template <class X>
__global__ void __launch_bounds__(kThreads) partial_sums_kernel(double* partial, const X* x, int64_t n, bool squares) {
  __shared__ double shared[kWarp];
  double s = 0.0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const double v = to_float(x[i]);
    s += squares ? v * v : v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads) final_sum_kernel(double* out, const double* partial, int count, bool accumulate) {
  __shared__ double shared[kWarp];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *out = accumulate ? *out + s : s;
}

}  // namespace

template <class X>
void reduce_sum(double* out, const X* x, int64_t n, bool squares, bool accumulate,
                double* scratch, cudaStream_t stream) {
  // The grid grows with n (at least kPerThread elements a thread) up to
  // kReduceBlocks, enough to fill a large GPU for a model's gradients; it
  // depends on n alone, so the bits do not depend on the device.
  constexpr int64_t kPerThread = 16;
  const auto blocks = static_cast<int>(
      std::clamp<int64_t>((n + kThreads * kPerThread - 1) / (kThreads * kPerThread), 1,
                          kReduceBlocks));
  partial_sums_kernel<<<blocks, kThreads, 0, stream>>>(scratch, x, n, squares);
  CUDA_CHECK_LAUNCH();
  final_sum_kernel<<<1, kThreads, 0, stream>>>(out, scratch, blocks, accumulate);
  CUDA_CHECK_LAUNCH();
}

template void reduce_sum<float>(double*, const float*, int64_t, bool, bool, double*, cudaStream_t);
template void reduce_sum<bf16>(double*, const bf16*, int64_t, bool, bool, double*, cudaStream_t);
template void reduce_sum<fp16>(double*, const fp16*, int64_t, bool, bool, double*, cudaStream_t);

}  // namespace mpiformer::cuda
