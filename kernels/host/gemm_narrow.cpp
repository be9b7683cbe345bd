// GEMMs on 16-bit inputs with float accumulation (gemm.hpp's narrow
// overloads). bf16 goes through oneDNN's matmul, which uses AVX512-BF16 or
// AMX where the CPU has them; fp16 (which x86 CPUs before AVX512-FP16 cannot
// multiply) and bf16 in a build without oneDNN are widened to float and run
// as fp32 products (gemm.cpp): the same products, exact inputs, float
// accumulation.
#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gemm.hpp"
#include "onednn_matmul.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

namespace {

// Per-thread scratch for the widened operands, kept between calls: a fresh
// allocation per product costs page faults and zeroing comparable to the
// product itself at the model's smaller shapes.
float* scratch(int which, int64_t n) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& b = buffers[which];
  if (b.size() < static_cast<size_t>(n)) b.resize(static_cast<size_t>(n));
  return b.data();
}

// Row-major op(X) of rows x cols stored with leading dimension `stride`,
// widened into a dense float matrix of the same layout as stored.
template <class A>
const float* widen(int which, bool trans, int64_t rows, int64_t cols, const A* x, int64_t stride) {
  const int64_t stored_rows = trans ? cols : rows, stored_cols = trans ? rows : cols;
  float* o = scratch(which, stored_rows * stored_cols);
  parallel_for("gemm_widen", stored_rows, [=](const int64_t r) {
    widen_n(o + r * stored_cols, x + r * stride, stored_cols);
  });
  return o;
}

template <class A, class C>
void gemm_widened(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const A* a,
                  int64_t lda, const A* b, int64_t ldb, float beta, C* c, int64_t ldc) {
  const float* wa = widen(0, ta, m, k, a, lda);
  const float* wb = widen(1, tb, k, n, b, ldb);
  const int64_t wlda = ta ? m : k, wldb = tb ? k : n;
  if constexpr (std::is_same_v<C, float>) {
    gemm(ta, tb, m, n, k, alpha, wa, wlda, wb, wldb, beta, c, ldc);
  } else {
    float* w = scratch(2, m * n);
    if (beta != 0.0f)
      parallel_for("gemm_widen_c", m, [=](const int64_t r) {
        widen_n(w + r * n, c + r * ldc, n);
      });
    gemm(ta, tb, m, n, k, alpha, wa, wlda, wb, wldb, beta, w, n);
    parallel_for("gemm_narrow_c", m, [=](const int64_t r) {
      narrow_n(c + r * ldc, w + r * n, n);
    });
  }
}

#ifdef MPIFORMER_HAVE_DNNL
// The 4-D descriptor of B x NH matrices rows x cols (op applied: a
// transposed operand swaps its last two strides).
dnnl::memory::desc head_desc(int64_t B, int64_t NH, int64_t rows, int64_t cols, bool trans,
                             HeadStrides s, dnnl::memory::data_type type) {
  using dims = dnnl::memory::dims;
  return dnnl::memory::desc(dims{B, NH, rows, cols}, type,
                            trans ? dims{s.batch, s.head, 1, s.ld} : dims{s.batch, s.head, s.ld, 1});
}
#endif

}  // namespace

template <class A, class C>
bool head_gemm_batched(bool ta, bool tb, int64_t B, int64_t NH, int64_t m, int64_t n, int64_t k,
                       float alpha, const A* a, HeadStrides sa, const A* b, HeadStrides sb,
                       float beta, C* c, HeadStrides sc) {
#ifdef MPIFORMER_HAVE_DNNL
  if constexpr (std::is_same_v<A, Bf16>) {
    // One oneDNN call for every head (strided batch dimensions).
    detail::GemmTimer timer;
    using dt = dnnl::memory::data_type;
    const auto ad = head_desc(B, NH, m, k, ta, sa, dt::bf16);
    const auto bd = head_desc(B, NH, k, n, tb, sb, dt::bf16);
    const auto cd = head_desc(B, NH, m, n, false, sc, std::is_same_v<C, float> ? dt::f32 : dt::bf16);
    return onednn::run_matmul(ad, bd, cd, alpha, beta, a, b, c);
  }
#endif
  return false;
}

#define MPIFORMER_HEAD_GEMM(A, C)                                                               \
  template bool head_gemm_batched<A, C>(bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                        float, const A*, HeadStrides, const A*, HeadStrides,     \
                                        float, C*, HeadStrides);
MPIFORMER_HEAD_GEMM(Bf16, float)
MPIFORMER_HEAD_GEMM(Bf16, Bf16)
MPIFORMER_HEAD_GEMM(Fp16, float)
MPIFORMER_HEAD_GEMM(Fp16, Fp16)
#undef MPIFORMER_HEAD_GEMM

template <class A, class C, std::enable_if_t<kNarrow<A>, int>>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const A* a, int64_t lda,
          const A* b, int64_t ldb, float beta, C* c, int64_t ldc) {
  detail::GemmTimer timer;
#ifdef MPIFORMER_HAVE_DNNL
  if constexpr (std::is_same_v<A, Bf16>) {
    if (onednn::matmul(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                       dnnl::memory::data_type::bf16,
                       std::is_same_v<C, float> ? dnnl::memory::data_type::f32
                                                : dnnl::memory::data_type::bf16))
      return;
  }
#endif
  gemm_widened(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template <class A>
bool linear_with_bias(A* out, const A* inp, const A* weight, const A* bias, int64_t N, int64_t C,
                      int64_t OC) {
#ifdef MPIFORMER_HAVE_DNNL
  if constexpr (std::is_same_v<A, Bf16>) {
    detail::GemmTimer timer;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    return onednn::run_matmul(dnnl::memory::desc(dims{N, C}, dt::bf16, dims{C, 1}),
                              dnnl::memory::desc(dims{C, OC}, dt::bf16, dims{1, C}),
                              dnnl::memory::desc(dims{N, OC}, dt::bf16, dims{OC, 1}), 1.0f, 0.0f,
                              inp, weight, out, bias);
  }
#endif
  (void)out, (void)inp, (void)weight, (void)bias, (void)N, (void)C, (void)OC;
  return false;
}
template bool linear_with_bias<Bf16>(Bf16*, const Bf16*, const Bf16*, const Bf16*, int64_t,
                                     int64_t, int64_t);
template bool linear_with_bias<Fp16>(Fp16*, const Fp16*, const Fp16*, const Fp16*, int64_t,
                                     int64_t, int64_t);

#define MPIFORMER_GEMM(A, C)                                                                    \
  template void gemm<A, C, 0>(bool, bool, int64_t, int64_t, int64_t, float, const A*, int64_t, \
                              const A*, int64_t, float, C*, int64_t);
MPIFORMER_GEMM(Bf16, Bf16)
MPIFORMER_GEMM(Bf16, float)
MPIFORMER_GEMM(Fp16, Fp16)
MPIFORMER_GEMM(Fp16, float)
#undef MPIFORMER_GEMM

template <class A>
double narrow_peak(int64_t n, int repeats) {
  // Random operands, as the sgemm peak's (constant data can run faster).
  std::vector<A> a(static_cast<size_t>(n * n)), b(a.size());
  std::vector<float> c(a.size());
  std::mt19937 gen(12345);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto* v : {&a, &b})
    for (A& x : *v) x = A(u(gen));
  gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / best;
}

double measure_narrow_gemm_peak(Element e, int64_t n, int repeats) {
  return e == Element::kBf16 ? narrow_peak<Bf16>(n, repeats) : narrow_peak<Fp16>(n, repeats);
}

std::string narrow_gemm_engine(Element e, bool* slow) {
  *slow = false;
  if (e == Element::kF16)
    return "fp16 stored, widened to fp32 for " + gemm_engine() + " (no fp16 arithmetic)";
#ifdef MPIFORMER_HAVE_DNNL
  const auto isa = dnnl::get_effective_cpu_isa();
  const bool bf16_units = isa == dnnl::cpu_isa::avx512_core_bf16 ||
                          isa == dnnl::cpu_isa::avx512_core_amx;
  *slow = !bf16_units;
  return onednn::version() +
         (bf16_units ? (isa == dnnl::cpu_isa::avx512_core_amx ? " bf16 matmuls on AMX"
                                                               : " bf16 matmuls on AVX512-BF16")
                     : " bf16 matmuls WITHOUT bf16 units (this CPU has neither AVX512-BF16 nor "
                       "AMX: emulated kernels, or the products widened to fp32 "
                       "where oneDNN has none; slower than fp32)");
#else
  *slow = true;
  return "bf16 widened to fp32 for " + gemm_engine() + " (built without oneDNN)";
#endif
}

}  // namespace mpiformer::host
