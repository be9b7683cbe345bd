// RMSNorm: a warp per row for the row's statistic and its input gradient;
// the weight's gradient through the column sums every norm uses (a fixed
// order, so the bits repeat).
#include "core/cuda_check.hpp"
#include "cuda/column_sums.cuh"
#include "cuda/rmsnorm.hpp"

namespace mpiformer::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

template <class A>
__global__ void rmsnorm_forward_kernel(A* out, float* rstd, const A* inp, const A* weight,
                                       int64_t N, int64_t C, float eps) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (n >= N) return;
  const A* x = inp + n * C;
  float ss = 0.f;
  for (int64_t c = lane; c < C; c += kWarp) ss += to_float(x[c]) * to_float(x[c]);
  const float r = rsqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  A* o = out + n * C;
  for (int64_t c = lane; c < C; c += kWarp)
    o[c] = from_float<A>(to_float(x[c]) * r * to_float(weight[c]));
  if (lane == 0) rstd[n] = r;
}

template <class A>
__global__ void rmsnorm_backward_input_kernel(A* dinp, const A* dout, const A* inp,
                                              const A* weight, const float* rstd, int64_t N,
                                              int64_t C) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (n >= N) return;
  const A* x = inp + n * C;
  const A* g = dout + n * C;
  const float s = rstd[n];
  float sum_gx = 0.f;
  for (int64_t c = lane; c < C; c += kWarp)
    sum_gx += to_float(g[c]) * to_float(weight[c]) * to_float(x[c]) * s;
  sum_gx = warp_sum(sum_gx) / static_cast<float>(C);
  A* d = dinp + n * C;
  for (int64_t c = lane; c < C; c += kWarp) {
    const float xhat = to_float(x[c]) * s;
    d[c] = from_float<A>(to_float(d[c]) + s * (to_float(g[c]) * to_float(weight[c]) - xhat * sum_gx));
  }
}

// dweight gets dout * xhat (the second sum is unused).
template <class A>
struct RmsNormParamTerm {
  const A* dout;
  const A* inp;
  const float* rstd;
  int64_t C;
  __device__ float2 operator()(int64_t n, int64_t c) const {
    return make_float2(to_float(dout[n * C + c]) * to_float(inp[n * C + c]) * rstd[n], 0.f);
  }
};

}  // namespace

template <class A>
void rmsnorm_forward(A* out, float* rstd, const A* inp, const A* weight, int64_t N, int64_t C,
                     float eps, cudaStream_t stream) {
  rmsnorm_forward_kernel<<<blocks_for(N, kRowsPerBlock), kRowsPerBlock * kWarp, 0, stream>>>(
      out, rstd, inp, weight, N, C, eps);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void rmsnorm_backward(A* dinp, float* dweight, const A* dout, const A* inp, const A* weight,
                      const float* rstd, int64_t N, int64_t C, const DeviceScratch& scratch,
                      cudaStream_t stream) {
  rmsnorm_backward_input_kernel<<<blocks_for(N, kRowsPerBlock), kRowsPerBlock * kWarp, 0,
                                  stream>>>(dinp, dout, inp, weight, rstd, N, C);
  CUDA_CHECK_LAUNCH();
  launch_column_sums<A>(dweight, static_cast<float*>(nullptr), N, C,
                        RmsNormParamTerm<A>{dout, inp, rstd, C}, scratch, stream);
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
