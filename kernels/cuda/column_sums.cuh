// Column sums of an [N, C] quantity into float accumulators, in a fixed
// order: the bias and LayerNorm parameter gradients. Atomics would be
// faster to write but change the bits from run to run.
//
// A block of 8 x 128 threads owns 8 columns; thread (x, y) walks rows
// y, y + 128, ... of column x, then the 128 partial sums of a column are
// added in y order. Narrow blocks give C / 8 blocks (128 for C = 1024),
// enough to occupy a large GPU; 8 floats are one 32-byte memory sector.
// `Term` gives the two summands of element (n, c) as a float2 (the second
// may be ignored: out1 null).
#pragma once
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

constexpr int kSumColumns = 8, kSumRows = 128;

template <class Term>
__global__ void column_sums_kernel(float* out0, float* out1, int64_t N, int64_t C, Term term) {
  __shared__ float s0[kSumRows][kSumColumns + 1], s1[kSumRows][kSumColumns + 1];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kSumColumns) + threadIdx.x;
  float a = 0.f, b = 0.f;
  if (c < C) {
    for (int64_t n = threadIdx.y; n < N; n += kSumRows) {
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
    for (int y = 0; y < kSumRows; ++y) {
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
  column_sums_kernel<<<blocks_for(C, kSumColumns), dim3(kSumColumns, kSumRows), 0, stream>>>(
      out0, out1, N, C, term);
}

}  // namespace mpiformer::cuda
