// Row-major fp32 GEMM on the GPU through cuBLAS, with the same argument
// order as host::gemm so the two back ends can be swapped and compared.
#pragma once
#include <cstdint>

namespace mpiformer::cuda {

class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  // C[M,N] = alpha * op(A) * op(B) + beta * C; pointers are device memory.
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc);

 private:
  void* handle_ = nullptr;  // cublasHandle_t, kept out of this header
};

}  // namespace mpiformer::cuda
