// Moving tokens to their experts and back (issue 30), by the router's
// dispatch rows (moe_router.hpp: dest[n k + j], the row of the dispatched
// buffer assignment j of token n goes to, -1 when dropped; each expert's
// rows contiguous).
//   dispatch: buf[dest[a]] = x[n] for every kept assignment a of token n;
//   combine:  y[n] = sum over token n's kept a of gate[a] buf_out[dest[a]]
//             (zero when all k dropped: the token keeps its residual).
// Rows are C wide. A: the storage type (storage_types.hpp); G: the gates'
// type (the router's Acc). Sums in compute_t<A>, in assignment order.
#pragma once
#include <cstdint>

#include "parallel.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

template <class A>
void moe_dispatch_forward(A* buf, const A* x, const int32_t* dest, int64_t N, int64_t K,
                          int64_t C) {
  parallel_for("moe_dispatch_forward", N, [=](const int64_t n) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t d = dest[n * K + j];
      if (d < 0) continue;
      for (int64_t c = 0; c < C; ++c) buf[d * C + c] = x[n * C + c];
    }
  });
}

// dx [N, C] accumulates (+=) the gradients of each kept copy.
template <class A>
void moe_dispatch_backward(A* dx, const A* dbuf, const int32_t* dest, int64_t N, int64_t K,
                           int64_t C) {
  using T = compute_t<A>;
  parallel_for("moe_dispatch_backward", N, [=](const int64_t n) {
    for (int64_t c = 0; c < C; ++c) {
      T s = ld(dx[n * C + c]);
      for (int64_t j = 0; j < K; ++j) {
        const int32_t d = dest[n * K + j];
        if (d >= 0) s += ld(dbuf[d * C + c]);
      }
      dx[n * C + c] = st<A>(s);
    }
  });
}

// y [N, C] is overwritten (=).
template <class A, class G>
void moe_combine_forward(A* y, const A* out, const G* gate, const int32_t* dest, int64_t N,
                         int64_t K, int64_t C) {
  using T = compute_t<A>;
  parallel_for("moe_combine_forward", N, [=](const int64_t n) {
    for (int64_t c = 0; c < C; ++c) {
      T s = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t d = dest[n * K + j];
        if (d >= 0) s += static_cast<T>(gate[n * K + j]) * ld(out[d * C + c]);
      }
      y[n * C + c] = st<A>(s);
    }
  });
}

// dout [M, C] (=) at every kept row (dropped assignments have none);
// dgate [N k] (=): each kept assignment's dot(dy[n], out[dest]), zero for
// the dropped.
template <class A, class G>
void moe_combine_backward(A* dout, G* dgate, const A* dy, const A* out, const G* gate,
                          const int32_t* dest, int64_t N, int64_t K, int64_t C) {
  using T = compute_t<A>;
  parallel_for("moe_combine_backward", N, [=](const int64_t n) {
    for (int64_t j = 0; j < K; ++j) {
      const int64_t a = n * K + j;
      const int32_t d = dest[a];
      if (d < 0) {
        dgate[a] = G(0);
        continue;
      }
      const T g = static_cast<T>(gate[a]);
      T dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        const T dyc = ld(dy[n * C + c]);
        dot += dyc * ld(out[d * C + c]);
        dout[d * C + c] = st<A>(g * dyc);
      }
      dgate[a] = static_cast<G>(dot);
    }
  });
}

}  // namespace mpiformer::host
