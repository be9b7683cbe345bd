#include "gemm.hpp"
#include "onednn_matmul.hpp"

#include <cblas.h>
#include <sched.h>
#include <strings.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace mpiformer::host {

namespace {
CBLAS_TRANSPOSE op(bool t) { return t ? CblasTrans : CblasNoTrans; }
thread_local double g_gemm_seconds = 0.0;
thread_local int g_gemm_depth = 0;

// Whether the BLAS multiplies with generic kernels: OpenBLAS's x86 kernel
// sets from before AVX, which it also falls back to on a CPU newer than it
// knows. Debian 12's OpenBLAS 0.3.21 takes a Xeon of model 207 (AVX512)
// for a "Prescott".
bool blas_kernels_generic() {
#ifdef MPIFORMER_HAVE_OPENBLAS
  const char* core = openblas_get_corename();
  for (const char* generic : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                              "Katmai", "Coppermine", "Northwood", "Banias"})
    if (core != nullptr && strcasecmp(core, generic) == 0) return true;
#endif
  return false;  // another BLAS: the one configured is trusted
}

// The fp32 products are oneDNN's where the BLAS runs generic kernels and
// oneDNN has a signal-safe matmul (onednn_matmul.hpp: brgemm, an AVX512
// CPU): oneDNN picks its kernels from the CPU's own flags, 1.2-10x the
// generic kernels' rate at the model's shapes. Elsewhere they stay the
// BLAS's: OpenBLAS's own AVX512 kernels (SkylakeX) beat oneDNN 2.6's
// brgemm 2-5x on some backward products (bench/RESULTS.md, "fp32 products
// through oneDNN where the BLAS runs generic kernels").
bool onednn_fp32() {
#ifdef MPIFORMER_HAVE_DNNL
  static const bool yes =
      blas_kernels_generic() && !onednn::implementation(dnnl::memory::data_type::f32).empty();
  return yes;
#else
  return false;
#endif
}
}  // namespace

detail::GemmTimer::GemmTimer() : t0_(std::chrono::steady_clock::now()) { ++g_gemm_depth; }

detail::GemmTimer::~GemmTimer() {
  if (--g_gemm_depth == 0)
    g_gemm_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

double gemm_seconds() { return g_gemm_seconds; }
void reset_gemm_seconds() { g_gemm_seconds = 0.0; }

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  detail::GemmTimer timer;
#ifdef MPIFORMER_HAVE_DNNL
  // Empty products (k = 0 scales C) are the BLAS's; so is a shape oneDNN
  // has no signal-safe kernel for.
  if (m > 0 && n > 0 && k > 0 && onednn_fp32() &&
      onednn::matmul(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                     dnnl::memory::data_type::f32, dnnl::memory::data_type::f32))
    return;
#endif
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  detail::GemmTimer timer;
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

void forget_products() {
#ifdef MPIFORMER_HAVE_DNNL
  onednn::forget_primitives();
#endif
}

std::string gemm_engine() {
#ifdef MPIFORMER_HAVE_DNNL
  if (onednn_fp32())
    return onednn::version() + " matmul (" +
           onednn::implementation(dnnl::memory::data_type::f32) + ")";
#endif
#ifdef MPIFORMER_HAVE_OPENBLAS
  return std::string("OpenBLAS sgemm, ") + openblas_get_corename() + " kernels";
#else
  return "the BLAS's sgemm";
#endif
}

double measure_gemm_peak(int64_t n, int repeats) {
  // Random operands: some processors run measurably faster on constant or
  // zero data, which would inflate the peak and understate MFU.
  std::vector<float> a(static_cast<size_t>(n * n)), b(a.size()), c(a.size(), 0.0f);
  std::mt19937 gen(12345);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto* v : {&a, &b})
    for (float& x : *v) x = u(gen);
  gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

int choose_compute_threads(int requested, int ranks_on_node) {
  if (requested > 0) return requested;
  for (const char* var : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) > 0) return std::atoi(v);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  int mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : static_cast<int>(online);
  if (mine >= online) mine /= std::max(1, ranks_on_node);  // not bound: share the node
  return std::max(1, mine);
}

void set_compute_threads(int n) {
  set_blas_threads(n);
#ifdef _OPENMP
  if (n > 0) omp_set_num_threads(n);
#endif
}

void set_blas_threads(int n) {
#ifdef MPIFORMER_HAVE_OPENBLAS
  if (n > 0) openblas_set_num_threads(n);
#else
  (void)n;
#endif
}

bool serial_in_parallel_region(bool fp64) {
  // oneDNN's products run on the calling thread inside a parallel region.
  if (!fp64 && onednn_fp32()) return true;
#ifdef MPIFORMER_HAVE_OPENBLAS
  return openblas_get_parallel() != 1;  // 0: sequential, 1: pthreads, 2: OpenMP
#else
  return false;  // unknown: leave the threading to the BLAS
#endif
}

int blas_threads() {
#ifdef _OPENMP
  if (onednn_fp32()) return omp_get_max_threads();  // oneDNN's (set_compute_threads)
#endif
#ifdef MPIFORMER_HAVE_OPENBLAS
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

}  // namespace mpiformer::host
