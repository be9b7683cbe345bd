// Residual connection: out = a + b.
// Its backward is the identity on both inputs, so it has no kernel: the
// stage keeps one residual-gradient buffer, lets the projection's backward
// read it directly, and layernorm_backward accumulates (+=) into it.
#pragma once
#include <cstdint>

#include "parallel.hpp"

namespace mpiformer::host {

template <class T>
void residual_forward(T* out, const T* a, const T* b, int64_t n) {
  parallel_for("residual_forward", n, [=](const int64_t i) { out[i] = a[i] + b[i]; });
}

}  // namespace mpiformer::host
