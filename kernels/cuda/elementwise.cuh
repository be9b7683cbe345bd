// Elementwise kernels (GELU, the residual add) over n elements of one to
// two inputs, in float arithmetic, with 16-byte loads and stores where
// every pointer allows them: a thread then moves 8 bf16 or 4 floats per
// access instead of one (a GPU moves memory in 32-byte sectors; 2-byte
// accesses leave most of each transaction unused). The last n mod 8 (or
// 4) elements, and any call whose pointers are not 16-byte aligned, take
// the element-at-a-time path, so every n and every offset works.
#pragma once
#include <cstdint>

#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

template <class A>
struct alignas(16) Pack16 {
  static constexpr int kCount = 16 / static_cast<int>(sizeof(A));
  A v[kCount];
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// V consecutive elements at p (16 bytes aligned when V > 1), as floats.
template <class A, int V>
__device__ __forceinline__ void load_pack(const A* p, float* out) {
  if constexpr (V == 1) {
    out[0] = to_float(*p);
  } else {
    static_assert(V == Pack16<A>::kCount, "a pack is 16 bytes");
    const Pack16<A> x = *reinterpret_cast<const Pack16<A>*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_float(x.v[i]);
  }
}
template <class A, int V>
__device__ __forceinline__ void store_pack(A* p, const float* in) {
  if constexpr (V == 1) {
    *p = from_float<A>(in[0]);
  } else {
    Pack16<A> x;
#pragma unroll
    for (int i = 0; i < V; ++i) x.v[i] = from_float<A>(in[i]);
    *reinterpret_cast<Pack16<A>*>(p) = x;
  }
}


// out[i] = op(a[i], b[i]) (b null: op(a[i], 0)); `vec`: threads below
// n / kCount take one pack each, the next n mod kCount one element each.
template <class A, class Op>
__global__ void elementwise_kernel(A* out, const A* a, const A* b, int64_t n, bool vec, Op op) {
  constexpr int P = Pack16<A>::kCount;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t packs = vec ? n / P : 0;
  if (i < packs) {
    const Pack16<A> x = reinterpret_cast<const Pack16<A>*>(a)[i];
    Pack16<A> y{};
    if (b != nullptr) y = reinterpret_cast<const Pack16<A>*>(b)[i];
    Pack16<A> r;
    for (int j = 0; j < P; ++j)
      r.v[j] = from_float<A>(op(to_float(x.v[j]), b != nullptr ? to_float(y.v[j]) : 0.f));
    reinterpret_cast<Pack16<A>*>(out)[i] = r;
    return;
  }
  const int64_t e = packs * P + (i - packs);
  if (e < n) out[e] = from_float<A>(op(to_float(a[e]), b != nullptr ? to_float(b[e]) : 0.f));
}

template <class A, class Op>
void launch_elementwise(A* out, const A* a, const A* b, int64_t n, Op op, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int P = Pack16<A>::kCount;
  const bool vec = aligned16(out) && aligned16(a) && (b == nullptr || aligned16(b));
  const int64_t threads = vec ? n / P + n % P : n;
  elementwise_kernel<<<blocks_for(threads, 256), 256, 0, stream>>>(out, a, b, n, vec, op);
}

}  // namespace mpiformer::cuda
