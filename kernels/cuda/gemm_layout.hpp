// The GEMMs the CUDA stage issues, and how each is put to cuBLASLt, as pure
// functions of the shapes: no CUDA here, so the CPU build tests every one
// against a column-major reference at the real models' shapes
// (tests/unit/test_gemm_layout.cpp), and the one GPU window does not have
// to find a transposed leading dimension.
//
// Our GEMMs are row-major: C[M,N] = op(A)[M,K] op(B)[K,N] (+ bias[N] on
// every row), A stored [M,K] (or [K,M] when transposed) with row stride
// lda, and so on. cuBLASLt is column-major. A row-major X[r,c] with stride
// ld is, read column-major, X^T[c,r] with the same ld; so the row-major
// C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T: the operands
// swap places and keep their transpose flags, M and N swap, and the bias
// over C's columns is a bias over C^T's rows, which is what cuBLASLt's bias
// epilogue adds.
#pragma once
#include <cstdint>

namespace mpiformer::cuda {

// `count` products; operand i starts `stride_*` elements after operand i-1.
struct GemmBatch {
  int64_t count = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// One row-major GEMM, as the kernels call it.
struct GemmCall {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  GemmBatch batch;
  bool bias = false;  // bias[n] added to every row of C
};

// A column-major matrix as cuBLASLt's layout descriptor holds it.
struct LtMatrix {
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch_stride = 0;  // elements between the matrices of a batch
};

// The column-major product D[m,n] = op(first)[m,k] op(second)[k,n], as
// cuBLASLt's descriptors say it: `first` is the row-major call's B, `second`
// its A (the swap above).
struct LtGemm {
  bool trans_first = false, trans_second = false;
  int64_t m = 0, n = 0, k = 0;
  LtMatrix first, second, out;  // out is C and D
  int64_t batch = 1;
  bool bias = false;  // bias[m] over D's rows
};

inline LtGemm lt_gemm(const GemmCall& g) {
  LtGemm lt;
  lt.trans_first = g.trans_b;
  lt.trans_second = g.trans_a;
  lt.m = g.n;
  lt.n = g.m;
  lt.k = g.k;
  // Stored shapes: B is [K,N] row-major ([N,K] transposed), i.e. [N,K]
  // column-major ([K,N] transposed); A likewise; C [M,N] is [N,M].
  lt.first = LtMatrix{g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb, g.batch.stride_b};
  lt.second = LtMatrix{g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda, g.batch.stride_a};
  lt.out = LtMatrix{g.n, g.m, g.ldc, g.batch.stride_c};
  lt.batch = g.batch.count;
  lt.bias = g.bias;
  return lt;
}

// ---- the stage's GEMMs (kernels/cuda/matmul.cu, attention.cu) ---------------

// out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC].
// `ld`: out's (dout's) row stride, 0 for OC (host/matmul.hpp's).
inline GemmCall matmul_forward_gemm(int64_t N, int64_t C, int64_t OC, bool bias, int64_t ld = 0) {
  return GemmCall{false, true, N, OC, C, C, C, ld != 0 ? ld : OC, GemmBatch{}, bias};
}
// dinp[N,C] = dout[N,OC] weight[OC,C].
inline GemmCall matmul_dinp_gemm(int64_t N, int64_t C, int64_t OC, int64_t ld = 0) {
  return GemmCall{false, false, N, C, OC, ld != 0 ? ld : OC, C, C, GemmBatch{}, false};
}
// dweight[OC,C] += dout[N,OC]^T inp[N,C].
inline GemmCall matmul_dweight_gemm(int64_t N, int64_t C, int64_t OC, int64_t ld = 0) {
  return GemmCall{true, false, OC, C, N, ld != 0 ? ld : OC, C, C, GemmBatch{}, false};
}

// Attention per (batch, head), BH of them, on q, k, v, y [T,hs] and the
// probabilities [T,T], each a uniform strided batch.
struct AttentionGemms {
  GemmCall scores;       // S = scale Q K^T
  GemmCall values;       // Y = A V
  GemmCall dprobs;       // dA = dY V^T
  GemmCall dvalues;      // dV = A^T dY
  GemmCall dqueries;     // dQ = dS K
  GemmCall dkeys;        // dK = dS^T Q
};
inline AttentionGemms attention_gemms(int64_t BH, int64_t T, int64_t hs) {
  const GemmBatch th_th{BH, T * hs, T * hs, T * T}, tt_th{BH, T * T, T * hs, T * hs};
  AttentionGemms g;
  g.scores = GemmCall{false, true, T, T, hs, hs, hs, T, th_th, false};
  g.values = GemmCall{false, false, T, hs, T, T, hs, hs, tt_th, false};
  g.dprobs = GemmCall{false, true, T, T, hs, hs, hs, T, th_th, false};
  g.dvalues = GemmCall{true, false, T, hs, T, T, hs, hs, tt_th, false};
  g.dqueries = GemmCall{false, false, T, hs, T, T, hs, hs, tt_th, false};
  g.dkeys = GemmCall{true, false, T, hs, T, T, hs, hs, tt_th, false};
  return g;
}

}  // namespace mpiformer::cuda
