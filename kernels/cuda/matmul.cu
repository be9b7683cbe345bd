#include "cuda/column_sums.cuh"
#include "core/cuda_check.hpp"
#include "core/error.hpp"
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
                    int64_t C, int64_t OC, int64_t ld) {
  blas.gemm(matmul_forward_gemm(N, C, OC, bias != nullptr, ld), 1.f, inp, weight, 0.f, out, bias);
}

template <class A>
void matmul_backward(Blas& blas, A* dinp, float* dweight, float* dbias, const A* dout,
                     const A* inp, const A* weight, int64_t N, int64_t C, int64_t OC, int64_t ld) {
  MPIFORMER_CHECK(dbias == nullptr || ld == 0 || ld == OC, "matmul_backward: a bias of columns");
  if (dinp != nullptr) blas.gemm(matmul_dinp_gemm(N, C, OC, ld), 1.f, dout, weight, 0.f, dinp);
  // Activation-type inputs, float output accumulated in place (beta = 1).
  if (dweight != nullptr)
    blas.gemm(matmul_dweight_gemm(N, C, OC, ld), 1.f, dout, inp, 1.f, dweight);
  if (dbias != nullptr) {
    launch_column_sums<A>(dbias, static_cast<float*>(nullptr), N, OC, BiasGradTerm<A>{dout, OC},
                          blas.scratch(), blas.stream(), {dout});
    CUDA_CHECK_LAUNCH();
  }
}

template <class A>
void matmul_input_grad(Blas& blas, float* dinp, bool accumulate, const A* dout, const A* weight,
                       int64_t N, int64_t C, int64_t OC, int64_t ld) {
  blas.gemm(matmul_dinp_gemm(N, C, OC, ld), 1.f, dout, weight, accumulate ? 1.f : 0.f, dinp);
}

#define MPIFORMER_INSTANTIATE(A)                                                               \
  template void matmul_forward<A>(Blas&, A*, const A*, const A*, const A*, int64_t, int64_t,    \
                                  int64_t, int64_t);                                            \
  template void matmul_backward<A>(Blas&, A*, float*, float*, const A*, const A*, const A*,     \
                                   int64_t, int64_t, int64_t, int64_t);                         \
  template void matmul_input_grad<A>(Blas&, float*, bool, const A*, const A*, int64_t, int64_t, \
                                     int64_t, int64_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)
#undef MPIFORMER_INSTANTIATE

}  // namespace mpiformer::cuda
