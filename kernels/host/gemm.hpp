// Row-major GEMM, overloaded on the scalar type so every kernel can be
// instantiated in float (training: the BLAS's sgemm, or oneDNN's matmul
// where the BLAS runs generic kernels: gemm.cpp) and double (gradient
// checks: the BLAS's dgemm).
//
// The 16-bit overloads multiply bf16 or fp16 inputs with float accumulation
// and write C in the inputs' type or in float (gemm_narrow.cpp).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>

#include "parallel.hpp"
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

// out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] as one oneDNN product
// with the bias added before the single rounding (A: Bf16 or Fp16): true
// where it ran (bf16 with oneDNN); false where the caller seeds the bias
// and multiplies.
template <class A>
bool linear_with_bias(A* out, const A* inp, const A* weight, const A* bias, int64_t N, int64_t C,
                      int64_t OC);

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

// True where a product of scalar S made inside an OpenMP parallel region
// runs on the calling thread alone: then independent small products may
// run side by side, one per thread. oneDNN's do, which take the float and
// bf16 products where they can (gemm.cpp); the BLAS's (double, or float
// elsewhere) do in OpenBLAS's OpenMP or sequential builds.
bool serial_in_parallel_region(bool fp64);
template <class S>
bool gemm_serial_in_parallel_region() {
  return serial_in_parallel_region(std::is_same_v<S, double>);
}

// Which operand of an attention product is causal (T x T, zero above the
// diagonal), so that only its blocks on or below the diagonal are
// multiplied: the output (the scores and their gradient: entries above the
// diagonal are left unwritten, the softmax never reads them), or the left
// operand (the probabilities or the score gradients, as stored or
// transposed).
enum class Causal { kOutput, kLeft };
// Rows of the causal matrix per block: smaller blocks skip more of the
// masked half (at T = 256, 64-row blocks multiply 10/16 of it) but make
// smaller products; 64 keeps them near the BLAS's peak at the model's
// shapes (bench/RESULTS.md, issue 26).
inline constexpr int64_t kCausalBlock = 64;

// One block of rows [r0, r1) of a causal product: its shape, and where its
// operands and output start relative to a head's.
struct CausalBlock {
  int64_t m, n, k, a, b, c;
};
inline CausalBlock causal_block(Causal causal, bool trans_a, bool trans_b, int64_t n, int64_t k,
                                int64_t T, int64_t r0, int64_t r1, HeadStrides sa,
                                HeadStrides sb, HeadStrides sc) {
  if (causal == Causal::kOutput)  // C[r0:r1, 0:r1] = op(A)[r0:r1, :] op(B)[:, 0:r1]
    return {r1 - r0, r1, k, trans_a ? r0 : r0 * sa.ld, 0, r0 * sc.ld};
  if (!trans_a)  // C[r0:r1, :] = A[r0:r1, 0:r1] op(B)[0:r1, :]
    return {r1 - r0, n, r1, r0 * sa.ld, 0, r0 * sc.ld};
  // C[r0:r1, :] = A[r0:T, r0:r1]^T op(B)[r0:T, :]
  return {r1 - r0, n, T - r0, r0 * sa.ld + r0, trans_b ? r0 : r0 * sb.ld, r0 * sc.ld};
}

// C[b,h] = alpha op(A[b,h]) op(B[b,h]) + beta C[b,h] for every head of an
// attention product (T: the causal matrix's size), multiplying only the
// blocks on and below the diagonal. In bf16 each block is one oneDNN call
// over all heads. Otherwise the heads run side by side where each product
// then runs on one thread (a head's products are too small to
// split between threads), or in order with each product threaded by the
// BLAS; 16-bit inputs are widened, accumulation is float. Either way every
// output element comes from one product of a fixed shape, so the result
// does not depend on the thread count.
template <class A, class C, class S>
void head_gemm(Causal causal, bool trans_a, bool trans_b, int64_t B, int64_t NH, int64_t m,
               int64_t n, int64_t k, S alpha, const A* a, HeadStrides sa, const A* b,
               HeadStrides sb, S beta, C* c, HeadStrides sc) {
  const int64_t T = causal == Causal::kOutput ? m : k;
  const int64_t blocks = (T + kCausalBlock - 1) / kCausalBlock;
  auto block = [&](int64_t i) {
    const int64_t r0 = i * kCausalBlock, r1 = r0 + kCausalBlock < T ? r0 + kCausalBlock : T;
    return causal_block(causal, trans_a, trans_b, n, k, T, r0, r1, sa, sb, sc);
  };
  detail::GemmTimer timer;  // on the calling thread, once
  // The heads of blocks [first, blocks) one after another.
  auto per_head = [&](int64_t first) {
    task_for(B * NH, gemm_serial_in_parallel_region<A>(), [&](const int64_t i) {
      const A* ah = a + (i / NH) * sa.batch + (i % NH) * sa.head;
      const A* bh = b + (i / NH) * sb.batch + (i % NH) * sb.head;
      C* ch = c + (i / NH) * sc.batch + (i % NH) * sc.head;
      for (int64_t j = first; j < blocks; ++j) {
        const CausalBlock p = block(j);
        gemm(trans_a, trans_b, p.m, p.n, p.k, alpha, ah + p.a, sa.ld, bh + p.b, sb.ld, beta,
             ch + p.c, sc.ld);
      }
    });
  };
  if constexpr (kNarrow<A>) {
    for (int64_t j = 0; j < blocks; ++j) {
      const CausalBlock p = block(j);
      if (!head_gemm_batched(trans_a, trans_b, B, NH, p.m, p.n, p.k, static_cast<float>(alpha),
                             a + p.a, sa, b + p.b, sb, static_cast<float>(beta), c + p.c, sc))
        return per_head(j);  // no batched product here (fp16; bf16 without oneDNN)
    }
    return;
  }
  per_head(0);
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

// What runs the fp32 products, for the run's summary.
std::string gemm_engine();

// Drops what the products' library keeps per shape (oneDNN's primitives and
// their generated code; nothing where the BLAS runs them), so that what a
// process holds afterwards is the later products' own: calibrate's memory
// probes measure each stage as a run of it would hold it.
void forget_products();

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
