// Column sums of an [N, C] quantity into float accumulators, in a fixed
// order: the bias and LayerNorm parameter gradients. Atomics would be
// faster to write but change the bits from run to run.
//
// A block of Columns x Rows threads (1024) owns Columns columns; thread
// (x, y) walks rows y, y + Rows, ... of column x, then the Rows partial sums
// of a column are added in y order. A row of the block reads one 32-byte
// memory sector of its inputs: 8 columns of float, 16 of bf16. Narrow
// blocks give C / Columns blocks (128 for C = 1024 in float), enough to
// occupy a large GPU. `Term` gives the two summands of element (n, c) as a
// float2 (the second may be ignored: out1 null).
#pragma once
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

constexpr int kSectorBytes = 32, kSumThreads = 1024;

template <int Columns, class Term>
__global__ void __launch_bounds__(kSumThreads)
    column_sums_kernel(float* out0, float* out1, int64_t N, int64_t C, Term term) {
  constexpr int Rows = kSumThreads / Columns;
  __shared__ float s0[Rows][Columns + 1], s1[Rows][Columns + 1];
  const int64_t c = blockIdx.x * static_cast<int64_t>(Columns) + threadIdx.x;
  float a = 0.f, b = 0.f;
  if (c < C) {
    for (int64_t n = threadIdx.y; n < N; n += Rows) {
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
    for (int y = 0; y < Rows; ++y) {
      sa += s0[y][threadIdx.x];
      sb += s1[y][threadIdx.x];
    }
    out0[c] += sa;
    if (out1 != nullptr) out1[c] += sb;
  }
}

// `A`: the type of the [N, C] inputs the terms read.
template <class A, class Term>
void launch_column_sums(float* out0, float* out1, int64_t N, int64_t C, Term term,
                        cudaStream_t stream) {
  constexpr int Columns = kSectorBytes / static_cast<int>(sizeof(A));
  column_sums_kernel<Columns><<<blocks_for(C, Columns), dim3(Columns, kSumThreads / Columns), 0,
                                stream>>>(out0, out1, N, C, term);
}

}  // namespace mpiformer::cuda
