// Linear layer: out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC].
// Weights are [out_features, in_features], as torch.nn.Linear and GPT-2's
// checkpoints store them; bias may be null (the tied LM head has none).
#pragma once
#include <cstdint>

#include "column_sums.hpp"
#include "gemm.hpp"
#include "parallel.hpp"

namespace mpiformer::host {

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C,
                    int64_t OC) {
  if (bias != nullptr) {
    // Seed the output with the bias so the GEMM adds into it (beta = 1).
    parallel_for("matmul_bias", N, [=](const int64_t n) {
      for (int64_t o = 0; o < OC; ++o) out[n * OC + o] = bias[o];
    });
  }
  gemm(false, true, N, OC, C, T(1), inp, C, weight, C, bias != nullptr ? T(1) : T(0), out, OC);
}

// dinp is overwritten (=): every matmul input is an activation with a single
// consumer. dweight/dbias accumulate (+=) across micro-batches.
// dinp may be null (nothing upstream needs it).
template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t N, int64_t C, int64_t OC) {
  if (dinp != nullptr) gemm(false, false, N, C, OC, T(1), dout, OC, weight, C, T(0), dinp, C);
  gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C);
  if (dbias != nullptr) column_sums_accumulate(dbias, dout, N, OC);
}

}  // namespace mpiformer::host
