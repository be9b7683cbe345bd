#include <type_traits>

#include "core/cuda_check.hpp"
#include "cuda/elementwise.cuh"
#include "cuda/residual.hpp"

namespace mpiformer::cuda {

namespace {

struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <class D, class S>
__global__ void add_into_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_float<D>(to_float(dst[i]) + to_float(src[i]));
}

}  // namespace

template <class D, class S>
void add_into(D* dst, const S* src, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if constexpr (std::is_same_v<D, S>) {
    launch_elementwise(dst, dst, src, n, Add{}, stream);  // 16-byte packs
  } else {
    constexpr unsigned kMaxBlocks = 4096;  // grid-stride beyond: n is a block's or a shard's
    const unsigned blocks = blocks_for(n, 256) < kMaxBlocks ? blocks_for(n, 256) : kMaxBlocks;
    add_into_kernel<<<blocks, 256, 0, stream>>>(dst, src, n);
  }
  CUDA_CHECK_LAUNCH();
}

template void add_into<float, float>(float*, const float*, int64_t, cudaStream_t);
template void add_into<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void add_into<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void add_into<fp16, float>(fp16*, const float*, int64_t, cudaStream_t);
template void add_into<float, fp16>(float*, const fp16*, int64_t, cudaStream_t);

template <class A>
void residual_forward(A* out, const A* a, const A* b, int64_t n, cudaStream_t stream) {
  launch_elementwise(out, a, b, n, Add{}, stream);
  CUDA_CHECK_LAUNCH();
}

template void residual_forward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void residual_forward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);
template void residual_forward<fp16>(fp16*, const fp16*, const fp16*, int64_t, cudaStream_t);

}  // namespace mpiformer::cuda
