// Row-major GEMM through CBLAS, overloaded on the scalar type so every kernel
// can be instantiated in float (training) and double (gradient checks).
//
// The 16-bit overloads multiply bf16 or fp16 inputs with float accumulation
// and write C in the inputs' type or in float (gemm_narrow.cpp).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>

#include "storage_types.hpp"

namespace mpiformer::host {

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, all row-major.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

// A: Bf16 or Fp16; C: float or A (gemm_narrow.cpp).
template <class A, class C, std::enable_if_t<kNarrow<A>, int> = 0>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const A* a,
          int64_t lda, const A* b, int64_t ldb, float beta, C* c, int64_t ldc);

// Attention's per-head products, all heads in one call: B x NH matrices,
// matrix (b, h) of X at x + b * batch + h * head, row-major with leading
// dimension ld.
struct HeadStrides {
  int64_t batch, head, ld;
};
// head_gemm's one-call case (A: Bf16 or Fp16; C: float or A): true when
// it ran (bf16 through oneDNN), false where the heads must go one by one.
template <class A, class C>
bool head_gemm_batched(bool trans_a, bool trans_b, int64_t B, int64_t NH, int64_t m, int64_t n,
                       int64_t k, float alpha, const A* a, HeadStrides sa, const A* b,
                       HeadStrides sb, float beta, C* c, HeadStrides sc);

// C[b,h] = alpha op(A[b,h]) op(B[b,h]) + beta C[b,h] for every head: one
// oneDNN call in bf16, else head after head, each product threaded by the
// BLAS (16-bit inputs widened, float accumulation; C in float or A).
template <class A, class C, class S>
void head_gemm(bool trans_a, bool trans_b, int64_t B, int64_t NH, int64_t m, int64_t n, int64_t k,
               S alpha, const A* a, HeadStrides sa, const A* b, HeadStrides sb, S beta, C* c,
               HeadStrides sc) {
  if constexpr (kNarrow<A>) {
    if (head_gemm_batched(trans_a, trans_b, B, NH, m, n, k, static_cast<float>(alpha), a, sa, b,
                          sb, static_cast<float>(beta), c, sc))
      return;
  }
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < NH; ++h)
      gemm(trans_a, trans_b, m, n, k, alpha, a + bb * sa.batch + h * sa.head, sa.ld,
           b + bb * sb.batch + h * sb.head, sb.ld, beta, c + bb * sc.batch + h * sc.head, sc.ld);
}

// FLOP/s of a large square product of 16-bit inputs (the path the run's
// matmuls take: oneDNN for bf16, widened sgemm for fp16), best of `repeats`.
double measure_narrow_gemm_peak(Element e, int64_t n = 2048, int repeats = 5);

// What runs the 16-bit products of element type `e`, for the run's summary;
// *slow when the CPU has no units for it (the run says so once at start).
std::string narrow_gemm_engine(Element e, bool* slow);

// Wall time spent inside gemm on this thread since the last reset: lets the
// trainer and the benchmarks split a step into matrix products and the rest.
double gemm_seconds();
void reset_gemm_seconds();

namespace detail {
// Adds the lifetime of the scope to gemm_seconds() (two clock reads a call,
// negligible next to even the smallest GEMM of the model); a product made
// inside another (a widened 16-bit one) is counted once, by the outer.
class GemmTimer {
 public:
  GemmTimer();
  ~GemmTimer();

 private:
  std::chrono::steady_clock::time_point t0_;
};
}  // namespace detail

// FLOP/s of a large square sgemm on this thread with the current BLAS
// threads, on random data: the practical fp32 peak MFU is measured
// against (the best of `repeats` after a warm-up).
double measure_gemm_peak(int64_t n = 2048, int repeats = 5);

// Threads the BLAS library may use (no-op where the BLAS has no such control).
void set_blas_threads(int n);
int blas_threads();

// Threads each rank computes with, the BLAS, oneDNN and the host kernels'
// loops alike, so that together they never ask for more cores than the
// rank has: `requested` when > 0 ([run] blas_threads); else
// OPENBLAS_NUM_THREADS or OMP_NUM_THREADS when set; else the cores this
// process may run on (its affinity: a launcher that binds ranks has already
// divided the node), divided among the node's `ranks_on_node` when the
// process is not bound.
int choose_compute_threads(int requested, int ranks_on_node);
// Sets the BLAS's and OpenMP's (oneDNN's and the loops') thread counts.
void set_compute_threads(int n);

}  // namespace mpiformer::host
