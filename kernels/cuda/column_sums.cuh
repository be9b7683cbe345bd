// Column sums of an [N, C] quantity into float accumulators, in a fixed
// order: the bias and LayerNorm parameter gradients. Atomics would be
// faster to write but change the bits from run to run.
//
// A block of 32 x 32 threads owns 32 columns; thread (x, y) walks rows
// y, y + 32, ... of column x, then the 32 partial sums of a column are added
// in y order. `Term` gives the two summands of element (n, c) as a float2
// (the second may be ignored: out1 null).
#pragma once
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

template <class Term>
__global__ void column_sums_kernel(float* out0, float* out1, int64_t N, int64_t C, Term term) {
  __shared__ float s0[kWarp][kWarp + 1], s1[kWarp][kWarp + 1];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kWarp) + threadIdx.x;
  float a = 0.f, b = 0.f;
  if (c < C) {
    for (int64_t n = threadIdx.y; n < N; n += kWarp) {
      const float2 t = term(n, c);
      a += t.x;
      b += t.y;
    }
  }
  s0[threadIdx.y][threadIdx.x] = a;
  s1[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sa = 0.f, sb = 0.f;
    for (int y = 0; y < kWarp; ++y) {
      sa += s0[y][threadIdx.x];
      sb += s1[y][threadIdx.x];
    }
    out0[c] += sa;
    if (out1 != nullptr) out1[c] += sb;
  }
}

template <class Term>
void launch_column_sums(float* out0, float* out1, int64_t N, int64_t C, Term term,
                        cudaStream_t stream) {
  column_sums_kernel<<<blocks_for(C, kWarp), dim3(kWarp, kWarp), 0, stream>>>(out0, out1, N, C,
                                                                              term);
}

}  // namespace mpiformer::cuda
