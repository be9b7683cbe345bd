// Column sums of an [N, C] quantity into float accumulators, in a fixed
// order: the bias and LayerNorm parameter gradients. Atomics would be
// faster to write but change the bits from run to run.
//
// A block of Columns x Rows threads (1024) owns Columns columns of a slice
// of the rows; thread (x, y) walks rows y, y + Rows, ... of its slice in
// column x, then the Rows partial sums of a column are added in y order. A
// row of the block reads one 32-byte memory sector of its inputs: 8 columns
// of float, 16 of bf16. Columns alone give C / Columns blocks (64 for
// C = 1024 in bf16): half an H200's 132 SMs, each walking 16 K rows. So
// the rows are cut into up to 32 slices, enough for about two blocks per
// SM; each slice's sums go to scratch, and a second kernel adds the slices
// of each column in slice order (deterministic, like one pass). Without
// scratch, or with few rows, one slice adds into the outputs directly.
// `Term` gives the two summands of element (n, c) as a float2 (the second
// may be ignored: out1 null).
#pragma once
#include "cuda/column_sum_slices.hpp"
#include "cuda/device.hpp"
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

constexpr int kSectorBytes = 32;

// Slice r's sums go to partial[r * C + c] (and partial[(R + r) * C + c]
// for out1), or, with partial null (one slice), are added to the outputs.
template <int Columns, class Term>
__global__ void __launch_bounds__(kSumThreads)
    column_sums_kernel(float* out0, float* out1, int64_t N, int64_t C, Term term, float* partial) {
  constexpr int Rows = kSumThreads / Columns;
  __shared__ float s0[Rows][Columns + 1], s1[Rows][Columns + 1];
  const int64_t c = blockIdx.x * static_cast<int64_t>(Columns) + threadIdx.x;
  const int64_t R = gridDim.y, r = blockIdx.y;
  const int64_t first = N * r / R, last = N * (r + 1) / R;
  float a = 0.f, b = 0.f;
  if (c < C) {
    for (int64_t n = first + threadIdx.y; n < last; n += Rows) {
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
    if (partial == nullptr) {
      out0[c] += sa;
      if (out1 != nullptr) out1[c] += sb;
    } else {
      partial[r * C + c] = sa;
      if (out1 != nullptr) partial[(R + r) * C + c] = sb;
    }
  }
}

// out[c] += the R slices' sums of column c, in slice order. (A template,
// like the kernel above, so that every file including this header shares
// one definition.)
template <int Threads>
__global__ void __launch_bounds__(Threads)
    column_sums_finish_kernel(float* out0, float* out1, const float* partial, int R, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float sa = 0.f, sb = 0.f;
  for (int r = 0; r < R; ++r) sa += partial[r * C + c];
  out0[c] += sa;
  if (out1 == nullptr) return;
  for (int r = 0; r < R; ++r) sb += partial[(R + r) * C + c];
  out1[c] += sb;
}

// `A`: the type of the [N, C] inputs the terms read.
template <class A, class Term>
void launch_column_sums(float* out0, float* out1, int64_t N, int64_t C, Term term,
                        const DeviceScratch& scratch, cudaStream_t stream) {
  constexpr int Columns = kSectorBytes / static_cast<int>(sizeof(A));
  const int R = column_sum_slices(N, C, Columns, scratch.bytes);
  float* partial = R > 1 ? static_cast<float*>(scratch.data) : nullptr;
  column_sums_kernel<Columns><<<dim3(blocks_for(C, Columns), static_cast<unsigned>(R)),
                                dim3(Columns, kSumThreads / Columns), 0, stream>>>(
      out0, out1, N, C, term, partial);
  if (R > 1)
    column_sums_finish_kernel<256><<<blocks_for(C, 256), 256, 0, stream>>>(out0, out1, partial, R, C);
}

}  // namespace mpiformer::cuda
