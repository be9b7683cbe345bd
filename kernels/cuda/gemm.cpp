#include "cuda/gemm.hpp"

#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "core/format.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device.hpp"
#include "cuda/fill.hpp"
#include "cuda/plan_cache.hpp"

namespace mpiformer::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  return t == DType::F32 ? CUDA_R_32F : t == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
}
const char* type_name(DType t) { return t == DType::F32 ? "fp32" : t == DType::BF16 ? "bf16" : "fp16"; }

// The alignment cuBLASLt may assume for a pointer (it picks vectorised
// kernels from it): the largest power of two up to 256 dividing the address.
// In a batch, every matrix must be as aligned as the first: the offset
// between two (stride elements) counts too.
uint32_t alignment(const void* p, int64_t stride_bytes = 0) {
  const auto v = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride_bytes);
  uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

size_t size_of(DType t) { return t == DType::F32 ? 4 : 2; }

using Key = std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t,
                       uint32_t>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

void release(Plan& p) {
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.c);
  cublasLtMatmulDescDestroy(p.op);
}

void set_batch(cublasLtMatrixLayout_t layout, int64_t count, int64_t stride) {
  const int32_t n = static_cast<int32_t>(count);
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n,
                                                sizeof n));
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
}

// The operand alignments a plan was made for: A, B, C and the bias.
struct Alignments {
  uint32_t a, b, c, bias;
};

Key key_of(DType in, DType out, const GemmCall& g, const Alignments& al) {
  return Key{static_cast<int>(in), static_cast<int>(out), g.trans_a, g.trans_b, g.m, g.n, g.k,
             g.lda, g.ldb, g.ldc, g.batch.count, g.batch.stride_a, g.batch.stride_b,
             g.batch.stride_c, g.bias, al.a, al.b, al.c, al.bias};
}

// The descriptors of one row-major call (its column-major view,
// gemm_layout.hpp: the operands swap places).
Plan describe(DType in, DType out, const GemmCall& g) {
  const LtGemm lt = lt_gemm(g);
  Plan p;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = lt.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = lt.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  const cublasLtEpilogue_t epi = lt.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  const auto layout = [&](cublasLtMatrixLayout_t* l, DType t, const LtMatrix& x) {
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, cuda_type(t), static_cast<uint64_t>(x.rows),
                                            static_cast<uint64_t>(x.cols), x.ld));
    if (lt.batch > 1) set_batch(*l, lt.batch, x.batch_stride);
  };
  layout(&p.a, in, lt.first);
  layout(&p.b, in, lt.second);
  layout(&p.c, out, lt.out);
  return p;
}

// cuBLASLt's first choice for the plan's descriptors.
cublasLtMatmulAlgo_t heuristic(cublasLtHandle_t handle, DType in, DType out, const GemmCall& g,
                               const Plan& p, const Alignments& al) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = Blas::kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  // A and B swap places in the column-major call; D is C.
  const uint32_t align[4] = {al.b, al.a, al.c, al.c};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &align[i], sizeof align[i]));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    throw SystemError(strprintf(
        "cuBLASLt has no algorithm for a %s x %s -> %s GEMM m=%lld n=%lld k=%lld (trans %d%d, "
        "batch %lld, bias %d): %s",
        type_name(in), type_name(in), type_name(out), static_cast<long long>(g.m),
        static_cast<long long>(g.n), static_cast<long long>(g.k), g.trans_a, g.trans_b,
        static_cast<long long>(g.batch.count), g.bias, cublasLtGetStatusString(st)));
  }
  return result.algo;
}

// The call whose algorithm `g` shares: its rows (m) and inner count (k)
// rounded up to their buckets (plan_cache.hpp) where the leading
// dimensions allow it. An expert's GEMMs vary in m (forward, input
// gradient) or in k (weight gradient), every step.
GemmCall bucketed(const GemmCall& g) {
  GemmCall b = g;
  if (g.batch.count != 1) return b;
  const int64_t m = gemm_rows_bucket(g.m), k = gemm_rows_bucket(g.k);
  if (!g.trans_a || g.lda >= m) b.m = m;
  if ((g.trans_a || g.lda >= k) && (!g.trans_b || g.ldb >= k)) b.k = k;
  return b;
}

}  // namespace

// Plans of exact shapes, least recently used first out; algorithms by
// bucketed shape (cleared when full: a query again gives the same answer).
struct Blas::Plans {
  static constexpr size_t kMaxPlans = 256, kMaxAlgorithms = 1024;
  LruMap<Key, Plan> exact{kMaxPlans, release};
  std::map<Key, cublasLtMatmulAlgo_t> algorithms;
};

Blas::Blas(cudaStream_t stream) : plans_(std::make_unique<Plans>()), stream_(stream) {
  cublasLtHandle_t h = nullptr;
  CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  workspace_ = device_alloc(Blas::kWorkspaceBytes);
}

Blas::~Blas() {
  plans_.reset();
  device_free(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

void Blas::run(DType in, DType out, const GemmCall& g, float alpha, const void* a,
               const void* b, float beta, void* c, const void* bias) {
  MPIFORMER_CHECK(g.bias == (bias != nullptr), "gemm: a bias pointer iff the call has a bias");
  const auto handle = static_cast<cublasLtHandle_t>(handle_);
  const Alignments al{alignment(a, g.batch.stride_a * size_of(in)),
                      alignment(b, g.batch.stride_b * size_of(in)),
                      alignment(c, g.batch.stride_c * size_of(out)), alignment(bias)};
  const Key key = key_of(in, out, g, al);
  Plan* p = plans_->exact.find(key);
  if (p == nullptr) {
    Plan fresh = describe(in, out, g);
    const GemmCall gb = bucketed(g);
    const Key kb = key_of(in, out, gb, al);
    auto it = plans_->algorithms.find(kb);
    if (it == plans_->algorithms.end()) {
      cublasLtMatmulAlgo_t algo{};
      if (kb == key) {
        algo = heuristic(handle, in, out, g, fresh, al);
      } else {
        Plan top = describe(in, out, gb);
        try {
          algo = heuristic(handle, in, out, gb, top, al);
        } catch (...) {
          release(top);
          release(fresh);
          throw;
        }
        release(top);
      }
      if (plans_->algorithms.size() >= Plans::kMaxAlgorithms) plans_->algorithms.clear();
      it = plans_->algorithms.emplace(kb, algo).first;
    }
    fresh.algo = it->second;
    // The bucket's algorithm, checked on this shape; where it does not
    // serve, this shape's own.
    cublasLtMatmulHeuristicResult_t check{};
    if (kb != key && (cublasLtMatmulAlgoCheck(handle, fresh.op, fresh.a, fresh.b, fresh.c, fresh.c,
                                              &fresh.algo, &check) != CUBLAS_STATUS_SUCCESS ||
                      check.workspaceSize > kWorkspaceBytes))
      fresh.algo = heuristic(handle, in, out, g, fresh, al);
    p = &plans_->exact.insert(key, fresh);
  }
  if (bias != nullptr) {
    // cuBLASLt reads the bias with vector loads: it must be 16-byte aligned
    // (every tensor of the parameter table is).
    MPIFORMER_CHECK(reinterpret_cast<uintptr_t>(bias) % 16 == 0,
                    "cuBLASLt bias pointer not 16-byte aligned");
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
  }
  CUBLAS_CHECK(cublasLtMatmul(handle, p->op, &alpha, b, p->a, a, p->b, &beta, c, p->c, c, p->c,
                              &p->algo, workspace_, kWorkspaceBytes, stream_));
}

double measure_gemm_peak(DType in, int64_t n, int repeats) {
  // Three n x n operands (384 MiB in bf16 at n = 8192) and a Blas
  // workspace: the measurement's, not the run's.
  const PeakExcluded not_the_runs;
  const size_t elt = in == DType::F32 ? 4 : 2, bytes = elt * static_cast<size_t>(n * n);
  void* a = device_alloc(bytes);
  void* b = device_alloc(bytes);
  void* c = device_alloc(bytes);
  // Random operands (cuda/fill.hpp): a GPU runs faster on zeros.
  const int64_t count = n * n;
  if (in == DType::F32) {
    fill_random(static_cast<float*>(a), count, 1, nullptr);
    fill_random(static_cast<float*>(b), count, 2, nullptr);
  } else if (in == DType::BF16) {
    fill_random(static_cast<bf16*>(a), count, 1, nullptr);
    fill_random(static_cast<bf16*>(b), count, 2, nullptr);
  } else {
    fill_random(static_cast<fp16*>(a), count, 1, nullptr);
    fill_random(static_cast<fp16*>(b), count, 2, nullptr);
  }
  double best = 0;
  {
    Blas blas;
    cudaEvent_t t0 = nullptr, t1 = nullptr;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    auto once = [&] {
      if (in == DType::F32) {
        blas.gemm(false, true, n, n, n, 1.f, static_cast<const float*>(a), n,
                  static_cast<const float*>(b), n, 0.f, static_cast<float*>(c), n);
      } else if (in == DType::BF16) {
        blas.gemm(false, true, n, n, n, 1.f, static_cast<const bf16*>(a), n,
                  static_cast<const bf16*>(b), n, 0.f, static_cast<bf16*>(c), n);
      } else {
        blas.gemm(false, true, n, n, n, 1.f, static_cast<const fp16*>(a), n,
                  static_cast<const fp16*>(b), n, 0.f, static_cast<fp16*>(c), n);
      }
    };
    once();  // warm-up: algorithm choice, clocks
    for (int r = 0; r < repeats; ++r) {
      CUDA_CHECK(cudaEventRecord(t0));
      once();
      CUDA_CHECK(cudaEventRecord(t1));
      CUDA_CHECK(cudaEventSynchronize(t1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
      best = std::max(best, 2.0 * static_cast<double>(n) * n * n / (1e-3 * ms));
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
  }
  device_free(a);
  device_free(b);
  device_free(c);
  return best;
}

}  // namespace mpiformer::cuda
