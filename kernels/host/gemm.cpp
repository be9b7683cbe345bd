#include "gemm.hpp"

#include <cblas.h>

#include <chrono>

namespace mpiformer::host {

namespace {
CBLAS_TRANSPOSE op(bool t) { return t ? CblasTrans : CblasNoTrans; }
thread_local double g_gemm_seconds = 0.0;

// Adds the lifetime of the scope to g_gemm_seconds (two clock reads a call,
// negligible next to even the smallest GEMM of the model).
class GemmTimer {
 public:
  GemmTimer() : t0_(std::chrono::steady_clock::now()) {}
  ~GemmTimer() {
    g_gemm_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};
}  // namespace

double gemm_seconds() { return g_gemm_seconds; }
void reset_gemm_seconds() { g_gemm_seconds = 0.0; }

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  GemmTimer timer;
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  GemmTimer timer;
  cblas_dgemm(CblasRowMajor, op(ta), op(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

void set_blas_threads(int n) {
#ifdef MPIFORMER_HAVE_OPENBLAS
  if (n > 0) openblas_set_num_threads(n);
#else
  (void)n;
#endif
}

int blas_threads() {
#ifdef MPIFORMER_HAVE_OPENBLAS
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

}  // namespace mpiformer::host
