#include "cuda/cuda_check.hpp"
#include "cuda/gemm.hpp"

namespace mpiformer::cuda {

Blas::Blas() {
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  handle_ = h;
}

Blas::~Blas() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

void Blas::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // cuBLAS is column-major: a row-major C = op(A) op(B) is the column-major
  // C^T = op(B)^T op(A)^T, so the operands swap places and keep their flags.
  CUBLAS_CHECK(cublasSgemm(static_cast<cublasHandle_t>(handle_), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                           ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                           static_cast<int>(m), static_cast<int>(k), &alpha, b,
                           static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c,
                           static_cast<int>(ldc)));
}

}  // namespace mpiformer::cuda
