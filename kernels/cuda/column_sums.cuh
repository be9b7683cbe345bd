// Column sums of an [N, C] quantity into float accumulators, in a fixed
// order: the bias gradients, and the norms' parameter gradients where a
// row is too wide to fuse them (norm_rows.cuh). Atomics would be faster
// to write but change the bits from run to run.
//
// A block of 32 x 8 threads owns 32 packs of columns of a slice of the
// rows; thread (x, y) walks rows y, y + 8, ... of its slice in pack x (V
// columns: 16 bytes, 8 bf16 or 4 floats, where C and the rows allow;
// else one), then the 8 partial sums of a column are added in y order.
// Columns alone give few blocks (3 for C = 768 in bf16), so the rows are
// cut into up to 64 slices, enough for about two blocks per SM of an
// H200; each slice's sums go to scratch, and a second kernel adds the
// slices of each column in slice order (deterministic, like one pass).
// Without scratch, or with few rows, one slice adds into the outputs
// directly. `Term::add<V>(n, c, a, b)` adds element (n, c..c+V)'s two
// summands into a[0..V) and b[0..V) (b may be ignored: out1 null).
#pragma once
#include <initializer_list>

#include "cuda/column_sum_slices.hpp"
#include "cuda/device.hpp"
#include "cuda/device_math.cuh"
#include "cuda/elementwise.cuh"

namespace mpiformer::cuda {

// Slice r's sums go to partial[r * C + c] (and partial[(R + r) * C + c]
// for out1), or, with partial null (one slice), are added to the outputs.
template <int V, class Term>
__global__ void __launch_bounds__(kSumPacks * kSumRows)
    column_sums_kernel(float* out0, float* out1, int64_t N, int64_t C, Term term, float* partial) {
  constexpr int Cols = kSumPacks * V;  // columns a block owns
  __shared__ float s0[kSumRows][Cols + 1], s1[kSumRows][Cols + 1];
  const int64_t c = (blockIdx.x * static_cast<int64_t>(kSumPacks) + threadIdx.x) * V;
  const int64_t R = gridDim.y, r = blockIdx.y;
  const int64_t first = N * r / R, last = N * (r + 1) / R;
  float a[V] = {}, b[V] = {};
  if (c < C)
    for (int64_t n = first + threadIdx.y; n < last; n += kSumRows) term.template add<V>(n, c, a, b);
  for (int i = 0; i < V; ++i) {
    s0[threadIdx.y][threadIdx.x * V + i] = a[i];
    s1[threadIdx.y][threadIdx.x * V + i] = b[i];
  }
  __syncthreads();
  // Each of the block's threads finishes at most one column.
  const int col = threadIdx.y * kSumPacks + threadIdx.x;
  const int64_t cc = blockIdx.x * static_cast<int64_t>(Cols) + col;
  if (col >= Cols || cc >= C) return;
  float sa = 0.f, sb = 0.f;
  for (int y = 0; y < kSumRows; ++y) {
    sa += s0[y][col];
    sb += s1[y][col];
  }
  if (partial == nullptr) {
    out0[cc] += sa;
    if (out1 != nullptr) out1[cc] += sb;
  } else {
    partial[r * C + cc] = sa;
    if (out1 != nullptr) partial[(R + r) * C + cc] = sb;
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

template <int V, class Term>
void launch_column_sums_packed(float* out0, float* out1, int64_t N, int64_t C, Term term,
                               const DeviceScratch& scratch, cudaStream_t stream) {
  const int R = column_sum_slices(N, C, kSumPacks * V, scratch.bytes);
  float* partial = R > 1 ? static_cast<float*>(scratch.data) : nullptr;
  column_sums_kernel<V><<<dim3(blocks_for(C, kSumPacks * V), static_cast<unsigned>(R)),
                          dim3(kSumPacks, kSumRows), 0, stream>>>(out0, out1, N, C, term, partial);
  if (R > 1)
    column_sums_finish_kernel<256><<<blocks_for(C, 256), 256, 0, stream>>>(out0, out1, partial, R, C);
}

// `A`: the type of the [N, C] inputs the terms read; `rows_at`: those
// inputs, whose rows must all start 16 bytes aligned for packs.
template <class A, class Term>
void launch_column_sums(float* out0, float* out1, int64_t N, int64_t C, Term term,
                        const DeviceScratch& scratch, cudaStream_t stream,
                        std::initializer_list<const void*> rows_at) {
  constexpr int P = Pack16<A>::kCount;
  bool packs = C % P == 0;
  for (const void* p : rows_at) packs = packs && aligned16(p);
  if (packs) {
    launch_column_sums_packed<P>(out0, out1, N, C, term, scratch, stream);
  } else {
    launch_column_sums_packed<1>(out0, out1, N, C, term, scratch, stream);
  }
}

}  // namespace mpiformer::cuda
