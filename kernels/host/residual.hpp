// Residual connection: out = a + b, rounded once to the storage type.
// Its backward is the identity on both inputs, so it has no kernel: the
// stage keeps one residual-gradient buffer, lets the projection's backward
// read it directly, and layernorm_backward accumulates (+=) into it.
#pragma once
#include <cstdint>

#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

template <class A>
void residual_forward(A* out, const A* a, const A* b, int64_t n) {
  parallel_for("residual_forward", n,
               [=](const int64_t i) { out[i] = st<A>(ld(a[i]) + ld(b[i])); });
}

// dst += src, added in the wider of the two types and rounded once to
// dst's: ZeRO's shards add float sums (float += float), and 16-bit
// gradients ([train] grad_dtype) take a block's float gradients into
// their 16-bit sum (bf16 += float) and their reduced 16-bit parts into
// the float shard (float += bf16).
template <class D, class S>
void add_into(D* dst, const S* src, int64_t n) {
  parallel_for("add_into", n, [=](const int64_t i) { dst[i] = st<D>(ld(dst[i]) + ld(src[i])); });
}

// dst = src rounded to dst's type (the weight copy from the masters).
template <class A, class F>
void convert(A* dst, const F* src, int64_t n) {
  parallel_for("convert", n, [=](const int64_t i) { dst[i] = st<A>(src[i]); });
}

}  // namespace mpiformer::host
