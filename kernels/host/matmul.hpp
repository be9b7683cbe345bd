// Linear layer: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC].
// Weights are [out_features, in_features], as torch.nn.Linear and GPT-2's
// checkpoints store them; bias may be null (the tied LM head has none).
// `ld`: out's (dout's) row stride where it is a column range of a wider
// matrix (the LM head's vocabulary pieces write and read their columns of
// the logits); 0 is OC.
// A is the storage type of activations and the weights the product reads;
// the products accumulate in float (or double), and the parameter gradients
// are in compute_t<A> (the masters' type).
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "column_sums.hpp"
#include "gemm.hpp"
#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

// x's columns [0, OC) of rows `ld` apart, dense: oneDNN 2.6 has no
// brgemm kernel for a bf16 operand whose rows are a column range of a
// wider matrix (the head's vocabulary pieces), and gemm then widens both
// operands to float, keeping the widened piece of the weights (rows x C
// floats, 50 MB at 12K rows of 1024) in per-thread scratch for good.
// Packed in bf16 (N x OC), the products take oneDNN's kernel. Float and
// fp16 go to BLAS, which takes the stride, as they are.
template <class A>
const A* dense_columns(const A* x, int64_t N, int64_t OC, int64_t ld) {
  if constexpr (!std::is_same_v<A, Bf16>) return x;
  if (ld == OC) return x;
  thread_local std::vector<A> packed;
  if (packed.size() < static_cast<size_t>(N * OC)) packed.resize(static_cast<size_t>(N * OC));
  A* to = packed.data();
  parallel_for("matmul_pack_columns", N,
               [=](const int64_t n) { std::copy_n(x + n * ld, OC, to + n * OC); });
  return to;
}

template <class A>
void matmul_forward(A* out, const A* inp, const A* weight, const A* bias, int64_t N, int64_t C,
                    int64_t OC, int64_t ld = 0) {
  using F = compute_t<A>;
  if (ld == 0) ld = OC;
  if constexpr (std::is_same_v<A, Bf16>) {
    if (ld != OC) {
      // Into its columns through a dense buffer (dense_columns' reason:
      // no oneDNN kernel writes a column range either).
      thread_local std::vector<A> dense;
      if (dense.size() < static_cast<size_t>(N * OC)) dense.resize(static_cast<size_t>(N * OC));
      A* d = dense.data();
      matmul_forward(d, inp, weight, bias, N, C, OC);
      parallel_for("matmul_unpack_columns", N,
                   [=](const int64_t n) { std::copy_n(d + n * OC, OC, out + n * ld); });
      return;
    }
  }
  if constexpr (kNarrow<A>) {
    if (bias != nullptr && ld == OC && linear_with_bias(out, inp, weight, bias, N, C, OC)) return;
  }
  if (bias != nullptr) {
    // Seed the output with the bias so the GEMM adds into it (beta = 1).
    parallel_for("matmul_bias", N, [=](const int64_t n) {
      for (int64_t o = 0; o < OC; ++o) out[n * ld + o] = bias[o];
    });
  }
  gemm(false, true, N, OC, C, F(1), inp, C, weight, C, bias != nullptr ? F(1) : F(0), out, ld);
}

// dinp is overwritten (=): every matmul input is an activation with a single
// consumer. dweight/dbias accumulate (+=) across micro-batches.
// dinp may be null (nothing upstream needs it), and dweight with dbias (the
// input gradient alone, its weight gradient computed by a second call while
// the tensor group sums the first: gpt_stage_impl.hpp).
template <class A, class F = compute_t<A>>
void matmul_backward(A* dinp, F* dweight, F* dbias, const A* dout, const A* inp, const A* weight,
                     int64_t N, int64_t C, int64_t OC, int64_t ld = 0) {
  if (ld == 0) ld = OC;
  if (dbias != nullptr && ld != OC) throw std::logic_error("matmul_backward: a bias of columns");
  if (dinp != nullptr || dweight != nullptr) {
    const A* d = dense_columns(dout, N, OC, ld);
    const int64_t ldd = d == dout ? ld : OC;
    if (dinp != nullptr) gemm(false, false, N, C, OC, F(1), d, ldd, weight, C, F(0), dinp, C);
    if (dweight != nullptr) gemm(true, false, OC, C, N, F(1), d, ldd, inp, C, F(1), dweight, C);
  }
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

// The input gradient in the compute type, = or (`accumulate`) +=: a
// product whose OC is split (the head's vocabulary pieces) summed in F
// over its parts before the one rounding to A.
template <class A, class F = compute_t<A>>
void matmul_input_grad(F* dinp, bool accumulate, const A* dout, const A* weight, int64_t N,
                       int64_t C, int64_t OC, int64_t ld) {
  const A* d = dense_columns(dout, N, OC, ld);
  gemm(false, false, N, C, OC, F(1), d, d == dout ? ld : OC, weight, C, accumulate ? F(1) : F(0),
       dinp, C);
}

}  // namespace mpiformer::host
