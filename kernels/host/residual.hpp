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

// dst = src rounded to dst's type (the weight copy from the masters).
template <class A, class F>
void convert(A* dst, const F* src, int64_t n) {
  parallel_for("convert", n, [=](const int64_t i) { dst[i] = st<A>(src[i]); });
}

}  // namespace mpiformer::host
