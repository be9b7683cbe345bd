// Kernels that check the CPU emulation itself (test_emulation.cpp): block
// barriers over shared memory, warp shuffles, multi-dimensional indices,
// threads that exit before a barrier, and barriers that cannot all complete.
// Written as CUDA, so the launch rewriting is part of what is tested.
#include "emulator_selftest.hpp"

namespace emu_test {

namespace {

__global__ void reverse_kernel(float* out, const float* in) {
  __shared__ float tile[256];
  const int t = threadIdx.x, base = blockIdx.x * blockDim.x;
  tile[t] = in[base + t];
  __syncthreads();
  out[base + t] = tile[blockDim.x - 1 - t];
}

__global__ void warp_sum_kernel(float* out, const float* in) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = in[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[i] = v;
}

__global__ void index_kernel(int* out) {
  const int i = (blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  out[i] = threadIdx.x + 10 * threadIdx.y + 100 * blockIdx.x;
}

// Warps past `live` exit; the rest meet at a barrier and read each other.
__global__ void early_exit_kernel(int* out, int live) {
  __shared__ int seen[256];
  const int t = threadIdx.x;
  if (t >= live) return;
  seen[t] = t;
  __syncthreads();
  out[t] = seen[live - 1 - t];
}

// Even lanes wait at the block barrier, odd lanes at a shuffle that needs
// the even lanes: on a GPU, a hang (or undefined behaviour).
__global__ void mismatched_barriers_kernel(int* out) {
  int v = 1;
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

}  // namespace

void reverse(float* out, const float* in, int blocks) {
  reverse_kernel<<<blocks, 256>>>(out, in);
}
void warp_sum(float* out, const float* in, int n) { warp_sum_kernel<<<n / 64, 64>>>(out, in); }
void indices(int* out, int blocks) { index_kernel<<<blocks, dim3(8, 4)>>>(out); }
void early_exit(int* out, int live) { early_exit_kernel<<<1, 256>>>(out, live); }
void mismatched_barriers(int* out) { mismatched_barriers_kernel<<<1, 64>>>(out); }

}  // namespace emu_test
