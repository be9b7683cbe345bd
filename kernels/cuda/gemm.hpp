// Row-major matrix products on the GPU through cuBLASLt, with the same
// argument order as host::gemm so the two back ends can be swapped and
// compared. Inputs are float or bf16; the output float or the inputs' type;
// accumulation is always float (CUBLAS_COMPUTE_32F, no TF32, so fp32 runs
// match the host to fp32 rounding). An optional bias (the output's type) is
// added to every row inside the GEMM (cuBLASLt's bias epilogue), and a
// uniform batch of products runs as one strided-batched call.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "cuda/precision.hpp"

namespace mpiformer::cuda {

enum class DType { F32, BF16 };
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::BF16;
}

// `count` products; operand i starts `stride_*` elements after operand i-1.
struct GemmBatch {
  int64_t count = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

class Blas {
 public:
  explicit Blas(cudaStream_t stream = nullptr);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  void set_stream(cudaStream_t stream) { stream_ = stream; }
  cudaStream_t stream() const { return stream_; }

  // C[M,N] = alpha * op(A) * op(B) + beta * C (+ bias[N] on every row).
  template <class In, class Out>
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const In* a,
            int64_t lda, const In* b, int64_t ldb, float beta, Out* c, int64_t ldc,
            const Out* bias = nullptr, const GemmBatch& batch = GemmBatch{}) {
    run(dtype_of<In>(), dtype_of<Out>(), trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
        ldc, bias, batch);
  }

 private:
  void run(DType in, DType out, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
           const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
           int64_t ldc, const void* bias, const GemmBatch& batch);
  struct Plans;  // cuBLASLt descriptors and chosen algorithms, per shape
  std::unique_ptr<Plans> plans_;
  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // device memory for the algorithms that want it
  cudaStream_t stream_ = nullptr;
};

// FLOP/s of a large square GEMM of `in` inputs (output of the same type,
// float accumulation) on the current device: the peak MFU is measured
// against, timed with CUDA events after a warm-up; the best of `repeats`.
double measure_gemm_peak(DType in, int64_t n = 8192, int repeats = 10);

}  // namespace mpiformer::cuda
