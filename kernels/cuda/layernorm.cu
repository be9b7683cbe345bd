// LayerNorm (norm_rows.cuh, centred): a warp per row, 16-byte packs, the
// parameter gradients fused into the backward's pass.
#include "common/op_constants.hpp"
#include "core/cuda_check.hpp"
#include "cuda/layernorm.hpp"
#include "cuda/norm_rows.cuh"

namespace mpiformer::cuda {

template <class A>
void layernorm_forward(A* out, float* mean, float* rstd, const A* inp, const A* weight,
                       const A* bias, int64_t N, int64_t C, cudaStream_t stream) {
  norm_forward<A, true>(out, mean, rstd, inp, weight, bias, N, C,
                        static_cast<float>(kLayerNormEps), stream);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void layernorm_backward(A* dinp, float* dweight, float* dbias, const A* dout, const A* inp,
                        const A* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, const DeviceScratch& scratch, cudaStream_t stream) {
  norm_backward<A, true>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, scratch,
                         stream);
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                             \
  template void layernorm_forward<A>(A*, float*, float*, const A*, const A*, const A*,       \
                                     int64_t, int64_t, cudaStream_t);                         \
  template void layernorm_backward<A>(A*, float*, float*, const A*, const A*, const A*,      \
                                      const float*, const float*, int64_t, int64_t,          \
                                      const DeviceScratch&, cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
