// Sums over a float range into a double on the device, in a fixed order (a
// grid fixed by n, then one block adding the partial sums in order), so the
// result is the same bits on every run and device: the global gradient norm
// (sum of squares, host twin host::sum_of_squares) and the loss of a
// micro-batch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

// Doubles of scratch the reductions need.
constexpr int kReduceBlocks = 1024;

// *out (device) = sum of x[i]^2 (squares) or of x[i], in double; with
// `accumulate`, added to *out instead. X: float, or bf16 / fp16 (16-bit
// gradients' norm, [train] grad_dtype).
template <class X>
void reduce_sum(double* out, const X* x, int64_t n, bool squares, bool accumulate,
                double* scratch, cudaStream_t stream);

}  // namespace mpiformer::cuda
