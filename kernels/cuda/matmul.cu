#include "cuda/column_sums.cuh"
#include "core/cuda_check.hpp"
#include "cuda/matmul.hpp"

namespace mpiformer::cuda {

namespace {

template <class A>
struct BiasGradTerm {
  const A* dout;
  int64_t OC;
  template <int V>
  __device__ void add(int64_t n, int64_t o, float* a, float*) const {
    float g[V];
    load_pack<A, V>(dout + n * OC + o, g);
    for (int i = 0; i < V; ++i) a[i] += g[i];
  }
};

}  // namespace

template <class A>
void matmul_forward(Blas& blas, A* out, const A* inp, const A* weight, const A* bias, int64_t N,
                    int64_t C, int64_t OC) {
  blas.gemm(matmul_forward_gemm(N, C, OC, bias != nullptr), 1.f, inp, weight, 0.f, out, bias);
}

template <class A>
void matmul_backward(Blas& blas, A* dinp, float* dweight, float* dbias, const A* dout,
                     const A* inp, const A* weight, int64_t N, int64_t C, int64_t OC) {
  if (dinp != nullptr) blas.gemm(matmul_dinp_gemm(N, C, OC), 1.f, dout, weight, 0.f, dinp);
  // Activation-type inputs, float output accumulated in place (beta = 1).
  if (dweight != nullptr) blas.gemm(matmul_dweight_gemm(N, C, OC), 1.f, dout, inp, 1.f, dweight);
  if (dbias != nullptr) {
    launch_column_sums<A>(dbias, static_cast<float*>(nullptr), N, OC, BiasGradTerm<A>{dout, OC},
                          blas.scratch(), blas.stream(), {dout});
    CUDA_CHECK_LAUNCH();
  }
}

template void matmul_forward<float>(Blas&, float*, const float*, const float*, const float*,
                                    int64_t, int64_t, int64_t);
template void matmul_forward<bf16>(Blas&, bf16*, const bf16*, const bf16*, const bf16*, int64_t,
                                   int64_t, int64_t);
template void matmul_backward<float>(Blas&, float*, float*, float*, const float*, const float*,
                                     const float*, int64_t, int64_t, int64_t);
template void matmul_backward<bf16>(Blas&, bf16*, float*, float*, const bf16*, const bf16*,
                                    const bf16*, int64_t, int64_t, int64_t);
template void matmul_forward<fp16>(Blas&, fp16*, const fp16*, const fp16*, const fp16*, int64_t,
                                   int64_t, int64_t);
template void matmul_backward<fp16>(Blas&, fp16*, float*, float*, const fp16*, const fp16*,
                                    const fp16*, int64_t, int64_t, int64_t);

}  // namespace mpiformer::cuda
