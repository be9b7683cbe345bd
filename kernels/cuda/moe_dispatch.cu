// Dispatch and combine: a thread per (token, channel) for the row moves
// and sums (each sum over the token's k assignments in order, as the
// host's); a warp per assignment for the gates' dot products.
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/moe_dispatch.hpp"

namespace mpiformer::cuda {

namespace {

template <class A>
__global__ void dispatch_forward_kernel(A* buf, const A* x, const int32_t* dest, int64_t N,
                                        int64_t K, int64_t C) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= N * C) return;
  const int64_t n = e / C, c = e % C;
  for (int64_t j = 0; j < K; ++j) {
    const int32_t d = dest[n * K + j];
    if (d >= 0) buf[d * C + c] = x[e];
  }
}

template <class A>
__global__ void dispatch_backward_kernel(A* dx, const A* dbuf, const int32_t* dest, int64_t N,
                                         int64_t K, int64_t C) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= N * C) return;
  const int64_t n = e / C, c = e % C;
  float s = to_float(dx[e]);
  for (int64_t j = 0; j < K; ++j) {
    const int32_t d = dest[n * K + j];
    if (d >= 0) s += to_float(dbuf[d * C + c]);
  }
  dx[e] = from_float<A>(s);
}

template <class A>
__global__ void combine_forward_kernel(A* y, const A* out, const float* gate, const int32_t* dest,
                                       int64_t N, int64_t K, int64_t C) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= N * C) return;
  const int64_t n = e / C, c = e % C;
  float s = 0.f;
  for (int64_t j = 0; j < K; ++j) {
    const int32_t d = dest[n * K + j];
    if (d >= 0) s += gate[n * K + j] * to_float(out[d * C + c]);
  }
  y[e] = from_float<A>(s);
}

template <class A>
__global__ void combine_backward_rows_kernel(A* dout, const A* dy, const float* gate,
                                             const int32_t* dest, int64_t N, int64_t K, int64_t C) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= N * K * C) return;
  const int64_t a = e / C, c = e % C, n = a / K;
  const int32_t d = dest[a];
  if (d >= 0) dout[d * C + c] = from_float<A>(gate[a] * to_float(dy[n * C + c]));
}

// A warp per assignment: its lanes stride the channels, then a fixed-order
// warp sum.
template <class A>
__global__ void combine_backward_gates_kernel(float* dgate, const A* dy, const A* out,
                                              const int32_t* dest, int64_t N, int64_t K, int64_t C) {
  const int64_t a = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (a >= N * K) return;
  const int32_t d = dest[a];
  const int64_t n = a / K;
  float s = 0.f;
  if (d >= 0)
    for (int64_t c = lane; c < C; c += kWarp) s += to_float(dy[n * C + c]) * to_float(out[d * C + c]);
  s = warp_sum(s);
  if (lane == 0) dgate[a] = s;
}

}  // namespace

template <class A>
void moe_dispatch_forward(A* buf, const A* x, const int32_t* dest, int64_t N, int64_t K,
                          int64_t C, cudaStream_t stream) {
  if (N * C == 0) return;
  dispatch_forward_kernel<<<blocks_for(N * C, 256), 256, 0, stream>>>(buf, x, dest, N, K, C);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void moe_dispatch_backward(A* dx, const A* dbuf, const int32_t* dest, int64_t N, int64_t K,
                           int64_t C, cudaStream_t stream) {
  if (N * C == 0) return;
  dispatch_backward_kernel<<<blocks_for(N * C, 256), 256, 0, stream>>>(dx, dbuf, dest, N, K, C);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void moe_combine_forward(A* y, const A* out, const float* gate, const int32_t* dest, int64_t N,
                         int64_t K, int64_t C, cudaStream_t stream) {
  if (N * C == 0) return;
  combine_forward_kernel<<<blocks_for(N * C, 256), 256, 0, stream>>>(y, out, gate, dest, N, K, C);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void moe_combine_backward(A* dout, float* dgate, const A* dy, const A* out, const float* gate,
                          const int32_t* dest, int64_t N, int64_t K, int64_t C,
                          cudaStream_t stream) {
  if (N * K == 0) return;
  if (C > 0) {
    combine_backward_rows_kernel<<<blocks_for(N * K * C, 256), 256, 0, stream>>>(dout, dy, gate,
                                                                                 dest, N, K, C);
    CUDA_CHECK_LAUNCH();
  }
  combine_backward_gates_kernel<<<blocks_for(N * K * kWarp, 256), 256, 0, stream>>>(
      dgate, dy, out, dest, N, K, C);
  CUDA_CHECK_LAUNCH();
}

namespace {
template <class A>
__global__ void widen_kernel(float* dst, const A* src, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = to_float(src[i]);
}
}  // namespace

template <class A>
void widen(float* dst, const A* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  widen_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dst, src, n);
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                                \
  template void widen<A>(float*, const A*, int64_t, cudaStream_t);                              \
  template void moe_dispatch_forward<A>(A*, const A*, const int32_t*, int64_t, int64_t, int64_t, \
                                        cudaStream_t);                                         \
  template void moe_dispatch_backward<A>(A*, const A*, const int32_t*, int64_t, int64_t,        \
                                         int64_t, cudaStream_t);                               \
  template void moe_combine_forward<A>(A*, const A*, const float*, const int32_t*, int64_t,     \
                                       int64_t, int64_t, cudaStream_t);                        \
  template void moe_combine_backward<A>(A*, float*, const A*, const A*, const float*,           \
                                        const int32_t*, int64_t, int64_t, int64_t, cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
