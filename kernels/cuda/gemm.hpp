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

#include "common/op_constants.hpp"
#include "cuda/device.hpp"
#include "cuda/gemm_layout.hpp"
#include "cuda/precision.hpp"

namespace mpiformer::cuda {

enum class DType { F32, BF16, F16 };
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
template <>
constexpr DType dtype_of<fp16>() {
  return DType::F16;
}

class Blas {
 public:
  explicit Blas(cudaStream_t stream = nullptr);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  // cuBLASLt's workspace (common/op_constants.hpp).
  static constexpr size_t kWorkspaceBytes = kDeviceWorkspaceBytes;

  void set_stream(cudaStream_t stream) { stream_ = stream; }
  // The workspace, for kernels queued on this Blas's stream between its
  // GEMMs (stream order keeps them apart): no op allocates.
  DeviceScratch scratch() const { return DeviceScratch{workspace_, kWorkspaceBytes}; }
  cudaStream_t stream() const { return stream_; }

  // C[M,N] = alpha * op(A) * op(B) + beta * C (+ bias[N] on every row
  // when call.bias), the shapes and strides as `call` gives them
  // (cuda/gemm_layout.hpp).
  template <class In, class Out>
  void gemm(const GemmCall& call, float alpha, const In* a, const In* b, float beta, Out* c,
            const Out* bias = nullptr) {
    run(dtype_of<In>(), dtype_of<Out>(), call, alpha, a, b, beta, c, bias);
  }
  // The same, one product without bias, its shape given in place.
  template <class In, class Out>
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const In* a,
            int64_t lda, const In* b, int64_t ldb, float beta, Out* c, int64_t ldc) {
    gemm(GemmCall{trans_a, trans_b, m, n, k, lda, ldb, ldc, GemmBatch{}, false}, alpha, a, b,
         beta, c);
  }

 private:
  void run(DType in, DType out, const GemmCall& call, float alpha, const void* a, const void* b,
           float beta, void* c, const void* bias);
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
