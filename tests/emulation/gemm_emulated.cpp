// cuda::Blas for the CPU emulation: the same row-major contract (float
// accumulation, optional bias on every row, strided batches), computed by
// the host BLAS in float with the operands converted from their storage
// type and the result rounded to it once, as cuBLASLt does.
#include <algorithm>
#include <vector>

#include "cuda/gemm.hpp"
#include "host/gemm.hpp"

namespace mpiformer::cuda {

namespace {

size_t size_of(DType t) { return t == DType::F32 ? 4 : 2; }

float load(DType t, const void* p, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(p)[i];
  if (t == DType::BF16) return __bfloat162float(static_cast<const bf16*>(p)[i]);
  return __half2float(static_cast<const fp16*>(p)[i]);
}

void store(DType t, void* p, int64_t i, float v) {
  if (t == DType::F32) {
    static_cast<float*>(p)[i] = v;
  } else if (t == DType::BF16) {
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<fp16*>(p)[i] = __float2half_rn(v);
  }
}

// Elements [0, n) of a stored operand, as float.
std::vector<float> widen(DType t, const void* p, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = load(t, p, i);
  return v;
}

}  // namespace

struct Blas::Plans {};

// The workspace is the kernels' scratch too (Blas::scratch).
Blas::Blas(cudaStream_t stream) : stream_(stream) { workspace_ = device_alloc(kWorkspaceBytes); }
Blas::~Blas() { device_free(workspace_); }

void Blas::run(DType in, DType out, const GemmCall& g, float alpha, const void* a,
               const void* b, float beta, void* c, const void* bias) {
  const bool ta = g.trans_a, tb = g.trans_b;
  const int64_t m = g.m, n = g.n, k = g.k, lda = g.lda, ldb = g.ldb, ldc = g.ldc;
  const GemmBatch& batch = g.batch;
  // The extent each stored operand spans: rows x leading dimension.
  const int64_t a_len = (ta ? k - 1 : m - 1) * lda + (ta ? m : k);
  const int64_t b_len = (tb ? n - 1 : k - 1) * ldb + (tb ? k : n);
  const int64_t c_len = (m - 1) * ldc + n;
  for (int64_t i = 0; i < batch.count; ++i) {
    const auto* ai = static_cast<const char*>(a) + i * batch.stride_a * size_of(in);
    const auto* bi = static_cast<const char*>(b) + i * batch.stride_b * size_of(in);
    auto* ci = static_cast<char*>(c) + i * batch.stride_c * size_of(out);
    const auto fa = widen(in, ai, a_len), fb = widen(in, bi, b_len);
    auto fc = widen(out, ci, c_len);
    host::gemm(ta, tb, m, n, k, alpha, fa.data(), lda, fb.data(), ldb, beta, fc.data(), ldc);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < n; ++col) {
        float v = fc[r * ldc + col];
        if (bias != nullptr) v += load(out, bias, col);
        store(out, ci, r * ldc + col, v);
      }
  }
}

double measure_gemm_peak(DType, int64_t, int) { return 1e9; }

}  // namespace mpiformer::cuda
