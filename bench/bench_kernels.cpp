// Google Benchmark of the host kernels at GPT-2 124M shapes: the sgemm
// shapes of every linear layer (FLOP/s) and each non-matmul kernel (bytes/s
// of compulsory traffic). Tokens per micro-batch: 4 x 64 and 4 x 256.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cblas.h>

#include <Kokkos_Core.hpp>
#include <vector>

#include "host/adamw.hpp"
#include "host/attention.hpp"
#include "host/crossentropy.hpp"
#include "host/gemm.hpp"
#include "host/gelu.hpp"
#include "host/layernorm.hpp"
#include "host/matmul.hpp"

namespace {

using namespace mpiformer::host;
constexpr int64_t C = 768, NH = 12, V = 50257, Vp = 50304;

std::vector<float> filled(int64_t n, float v = 0.01f) { return std::vector<float>(n, v); }

// args: tokens, in_features, out_features
void BM_LinearForward(benchmark::State& st) {
  const int64_t N = st.range(0), K = st.range(1), OC = st.range(2);
  auto x = filled(N * K), w = filled(OC * K), b = filled(OC), y = filled(N * OC);
  for (auto _ : st) matmul_forward(y.data(), x.data(), w.data(), b.data(), N, K, OC);
  st.counters["FLOP/s"] = benchmark::Counter(2.0 * N * K * OC * st.iterations(), benchmark::Counter::kIsRate);
}
void BM_LinearBackward(benchmark::State& st) {
  const int64_t N = st.range(0), K = st.range(1), OC = st.range(2);
  auto x = filled(N * K), w = filled(OC * K), dy = filled(N * OC), dx = filled(N * K),
       dw = filled(OC * K), db = filled(OC);
  for (auto _ : st) matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, K, OC);
  st.counters["FLOP/s"] = benchmark::Counter(4.0 * N * K * OC * st.iterations(), benchmark::Counter::kIsRate);
}
void linear_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {256, 1024})
    for (auto [k, oc] : {std::pair<int64_t, int64_t>{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, Vp}})
      b->Args({n, k, oc});
}
// The fp32 products themselves, the project's path (host::gemm: oneDNN's
// sgemm where built with it) against the BLAS's cblas_sgemm called
// directly, in one process: a linear layer's three products, forward
// (x W^T), input gradient (dy W) and weight gradient (dy^T x).
// args: engine (0 the BLAS, 1 host::gemm), product (0, 1, 2), tokens, in, out
void BM_Sgemm(benchmark::State& st) {
  const bool blas = st.range(0) == 0;
  const int64_t op = st.range(1), N = st.range(2), K = st.range(3), OC = st.range(4);
  auto x = filled(N * K), w = filled(OC * K), y = filled(N * OC);
  struct P {
    bool ta, tb;
    int64_t m, n, k;
    const float* a;
    int64_t lda;
    const float* b;
    int64_t ldb;
    float* c;
    int64_t ldc;
  };
  const P p = op == 0 ? P{false, true, N, OC, K, x.data(), K, w.data(), K, y.data(), OC}
            : op == 1 ? P{false, false, N, K, OC, y.data(), OC, w.data(), K, x.data(), K}
                      : P{true, false, OC, K, N, y.data(), OC, x.data(), K, w.data(), K};
  for (auto _ : st) {
    if (blas)
      cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans,
                  p.tb ? CblasTrans : CblasNoTrans, int(p.m), int(p.n), int(p.k), 1.0f, p.a,
                  int(p.lda), p.b, int(p.ldb), 0.0f, p.c, int(p.ldc));
    else
      gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, p.a, p.lda, p.b, p.ldb, 0.0f, p.c, p.ldc);
  }
  st.SetLabel(blas ? "cblas_sgemm" : gemm_engine());
  st.counters["FLOP/s"] =
      benchmark::Counter(2.0 * N * K * OC * st.iterations(), benchmark::Counter::kIsRate);
}
void sgemm_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t engine : {0, 1})
    for (int64_t op : {0, 1, 2})
      for (int64_t n : {256, 1024})
        for (auto [k, oc] : {std::pair<int64_t, int64_t>{C, 3 * C}, {C, 4 * C}, {4 * C, C}})
          b->Args({engine, op, n, k, oc});
}
BENCHMARK(BM_Sgemm)->Apply(sgemm_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK(BM_LinearForward)->Apply(linear_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LinearBackward)->Apply(linear_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LayerNorm(benchmark::State& st) {
  const int64_t N = st.range(0);
  auto x = filled(N * C), y = filled(N * C), w = filled(C), b = filled(C), m = filled(N), r = filled(N);
  auto dx = filled(N * C), dw = filled(C), db = filled(C);
  for (auto _ : st) {
    layernorm_forward(y.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C);
    layernorm_backward(dx.data(), dw.data(), db.data(), y.data(), x.data(), w.data(), m.data(), r.data(), N, C);
  }
  st.counters["bytes/s"] = benchmark::Counter(4.0 * N * C * 6 * st.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LayerNorm)->Arg(256)->Arg(1024)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_Gelu(benchmark::State& st) {
  const int64_t n = st.range(0) * 4 * C;
  auto x = filled(n), y = filled(n), dx = filled(n);
  for (auto _ : st) {
    gelu_forward(y.data(), x.data(), n);
    gelu_backward(dx.data(), x.data(), y.data(), n);
  }
  st.counters["bytes/s"] = benchmark::Counter(4.0 * n * 5 * st.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Gelu)->Arg(256)->Arg(1024)->Unit(benchmark::kMicrosecond)->UseRealTime();

// args: batch, sequence length
void BM_Attention(benchmark::State& st) {
  const int64_t B = st.range(0), T = st.range(1);
  auto qkv = filled(B * T * 3 * C), out = filled(B * T * C), att = filled(B * NH * T * T),
       datt = filled(B * NH * T * T), dqkv = filled(B * T * 3 * C);
  for (auto _ : st) {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, NH);
    attention_backward(dqkv.data(), datt.data(), out.data(), qkv.data(), att.data(), B, T, C, NH, NH);
  }
  // Executed FLOPs (full T x T products): 2 forward + 4 backward GEMMs.
  st.counters["FLOP/s"] = benchmark::Counter(6.0 * 2 * B * NH * T * T * (C / NH) * st.iterations(),
                                             benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Attention)->Args({4, 64})->Args({4, 256})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CrossEntropy(benchmark::State& st) {
  const int64_t N = st.range(0);
  auto logits = filled(N * Vp), losses = filled(N);
  std::vector<int32_t> y(N, 17);
  for (auto _ : st) crossentropy_forward_backward(losses.data(), logits.data(), y.data(), N, V, Vp, 1e-3f);
  st.counters["bytes/s"] = benchmark::Counter(4.0 * N * Vp * 2 * st.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CrossEntropy)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AdamW(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto p = filled(n), g = filled(n), m = filled(n), v = filled(n);
  int64_t step = 1;
  for (auto _ : st) adamw_update(p.data(), g.data(), m.data(), v.data(), n, AdamWParams{1e-4, 0.9, 0.95, 1e-8, 0.1, step++, 1.0});
  st.counters["bytes/s"] = benchmark::Counter(4.0 * n * 7 * st.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AdamW)->Arg(1 << 24)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  MPI_Finalize();
  return 0;
}
