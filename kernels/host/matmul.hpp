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
#include <cstdint>
#include <stdexcept>

#include "column_sums.hpp"
#include "gemm.hpp"
#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

template <class A>
void matmul_forward(A* out, const A* inp, const A* weight, const A* bias, int64_t N, int64_t C,
                    int64_t OC, int64_t ld = 0) {
  using F = compute_t<A>;
  if (ld == 0) ld = OC;
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
  if (dinp != nullptr) gemm(false, false, N, C, OC, F(1), dout, ld, weight, C, F(0), dinp, C);
  if (dweight != nullptr) gemm(true, false, OC, C, N, F(1), dout, ld, inp, C, F(1), dweight, C);
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

// The input gradient in the compute type, = or (`accumulate`) +=: a
// product whose OC is split (the head's vocabulary pieces) summed in F
// over its parts before the one rounding to A.
template <class A, class F = compute_t<A>>
void matmul_input_grad(F* dinp, bool accumulate, const A* dout, const A* weight, int64_t N,
                       int64_t C, int64_t OC, int64_t ld) {
  gemm(false, false, N, C, OC, F(1), dout, ld, weight, C, accumulate ? F(1) : F(0), dinp, C);
}

}  // namespace mpiformer::host
