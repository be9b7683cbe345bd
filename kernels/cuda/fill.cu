#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/fill.hpp"

namespace mpiformer::cuda {

namespace {

constexpr int kThreads = 256;

// SplitMix64's finaliser: consecutive inputs give unrelated outputs.
__device__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <class A>
__global__ void __launch_bounds__(kThreads) fill_random_kernel(A* p, int64_t n, uint64_t seed) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float u = static_cast<float>(mix(seed + static_cast<uint64_t>(i)) >> 40) * 0x1p-24f;
  p[i] = from_float<A>(2.f * u - 1.f);
}

template <class A>
void fill(A* p, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(p, n, seed);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void fill_random(float* p, int64_t n, uint64_t seed, cudaStream_t stream) {
  fill(p, n, seed, stream);
}
void fill_random(bf16* p, int64_t n, uint64_t seed, cudaStream_t stream) {
  fill(p, n, seed, stream);
}
void fill_random(fp16* p, int64_t n, uint64_t seed, cudaStream_t stream) {
  fill(p, n, seed, stream);
}

}  // namespace mpiformer::cuda
