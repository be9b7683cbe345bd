// Checks for CUDA runtime and cuBLAS calls: the call, the file and line,
// and the library's own reason, thrown as SystemError.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.hpp"

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    const cudaError_t mpiformer_err_ = (call);                                            \
    if (mpiformer_err_ != cudaSuccess)                                                    \
      ::mpiformer::throw_system_error(#call, __FILE__, __LINE__,                          \
                                      cudaGetErrorString(mpiformer_err_));                \
  } while (0)

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    const cublasStatus_t mpiformer_st_ = (call);                                          \
    if (mpiformer_st_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::mpiformer::throw_system_error(#call, __FILE__, __LINE__,                          \
                                      cublasLtGetStatusString(mpiformer_st_));              \
  } while (0)

// After a kernel launch: configuration errors surface here, at the launch
// that caused them, instead of at some later synchronising call.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
