// RMSNorm (norm_rows.cuh, not centred): a warp per row, 16-byte packs,
// the weight's gradient fused into the backward's pass.
#include "core/cuda_check.hpp"
#include "cuda/norm_rows.cuh"
#include "cuda/rmsnorm.hpp"

namespace mpiformer::cuda {

template <class A>
void rmsnorm_forward(A* out, float* rstd, const A* inp, const A* weight, int64_t N, int64_t C,
                     float eps, cudaStream_t stream) {
  norm_forward<A, false>(out, nullptr, rstd, inp, weight, nullptr, N, C, eps, stream);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void rmsnorm_backward(A* dinp, float* dweight, const A* dout, const A* inp, const A* weight,
                      const float* rstd, int64_t N, int64_t C, const DeviceScratch& scratch,
                      cudaStream_t stream) {
  norm_backward<A, false>(dinp, dweight, nullptr, dout, inp, weight, nullptr, rstd, N, C, scratch,
                          stream);
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                              \
  template void rmsnorm_forward<A>(A*, float*, const A*, const A*, int64_t, int64_t, float,   \
                                   cudaStream_t);                                             \
  template void rmsnorm_backward<A>(A*, float*, const A*, const A*, const A*, const float*,   \
                                    int64_t, int64_t, const DeviceScratch&, cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
