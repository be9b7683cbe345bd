#include "cuda/column_sums.cuh"
#include "core/cuda_check.hpp"
#include "cuda/layernorm.hpp"
#include "common/op_constants.hpp"

namespace mpiformer::cuda {

namespace {

constexpr float kEps = static_cast<float>(kLayerNormEps);
constexpr int kRowsPerBlock = 8;  // one warp per row

template <class A>
__global__ void layernorm_forward_kernel(A* out, float* mean, float* rstd, const A* inp,
                                         const A* weight, const A* bias, int64_t N, int64_t C) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (n >= N) return;
  const A* x = inp + n * C;
  float s = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) s += to_float(x[c]);
  const float m = warp_sum(s) / static_cast<float>(C);
  // Two passes over the row (it is in L1/L2 by now): the variance from
  // deviations, not E[x^2] - m^2, which cancels badly for large means.
  float v = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float d = to_float(x[c]) - m;
    v += d * d;
  }
  const float r = rsqrtf(warp_sum(v) / static_cast<float>(C) + kEps);
  A* o = out + n * C;
  for (int64_t c = lane; c < C; c += kWarp)
    o[c] = from_float<A>((to_float(x[c]) - m) * r * to_float(weight[c]) + to_float(bias[c]));
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

template <class A>
__global__ void layernorm_backward_input_kernel(A* dinp, const A* dout, const A* inp,
                                                const A* weight, const float* mean,
                                                const float* rstd, int64_t N, int64_t C) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (n >= N) return;
  const A* x = inp + n * C;
  const A* g = dout + n * C;
  const float m = mean[n], s = rstd[n];
  float sum_g = 0.f, sum_gx = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float gn = to_float(g[c]) * to_float(weight[c]);
    sum_g += gn;
    sum_gx += gn * (to_float(x[c]) - m) * s;
  }
  sum_g = warp_sum(sum_g) / static_cast<float>(C);
  sum_gx = warp_sum(sum_gx) / static_cast<float>(C);
  A* d = dinp + n * C;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float xhat = (to_float(x[c]) - m) * s;
    const float gn = to_float(g[c]) * to_float(weight[c]);
    d[c] = from_float<A>(to_float(d[c]) + s * (gn - sum_g - xhat * sum_gx));
  }
}

// dweight gets dout * xhat, dbias gets dout.
template <class A>
struct LayerNormParamTerm {
  const A* dout;
  const A* inp;
  const float* mean;
  const float* rstd;
  int64_t C;
  __device__ float2 operator()(int64_t n, int64_t c) const {
    const float g = to_float(dout[n * C + c]);
    return make_float2(g * (to_float(inp[n * C + c]) - mean[n]) * rstd[n], g);
  }
};

}  // namespace

template <class A>
void layernorm_forward(A* out, float* mean, float* rstd, const A* inp, const A* weight,
                       const A* bias, int64_t N, int64_t C, cudaStream_t stream) {
  layernorm_forward_kernel<<<blocks_for(N, kRowsPerBlock), kRowsPerBlock * kWarp, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void layernorm_backward(A* dinp, float* dweight, float* dbias, const A* dout, const A* inp,
                        const A* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C, const DeviceScratch& scratch, cudaStream_t stream) {
  layernorm_backward_input_kernel<<<blocks_for(N, kRowsPerBlock), kRowsPerBlock * kWarp, 0,
                                    stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  launch_column_sums<A>(dweight, dbias, N, C, LayerNormParamTerm<A>{dout, inp, mean, rstd, C},
                        scratch, stream);
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
