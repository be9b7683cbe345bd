// One warp's 16 x 8 x 16 tile products, in the register layouts of PTX's
// mma.sync.aligned.m16n8k16 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"). With g = lane / 4 and
// q = lane % 4, a lane holds
//   A (16 x 16, [m][k]): x0..x7 = (g,2q) (g,2q+1) (g+8,2q) (g+8,2q+1)
//                                 (g,2q+8) (g,2q+9) (g+8,2q+8) (g+8,2q+9)
//   B (16 x 8,  [k][n]): x0..x3 = (2q,g) (2q+1,g) (2q+8,g) (2q+9,g)
//   C (16 x 8,  [m][n]): x0..x3 = (g,2q) (g,2q+1) (g+8,2q) (g+8,2q+1)
// so a kernel knows the row and column of every accumulator it holds (the
// online softmax rescales rows in registers), and two C tiles side by side
// are, element for element, the A fragment of the next product (the
// probabilities go from the score product into P V without shared memory).
//
// On sm_80+ 16-bit operands load with ldmatrix (four 8 x 8 matrices a
// warp; .trans for operands stored the other way) and multiply with
// mma.sync, float accumulation. Everywhere else (fp32 operands, which
// must not be rounded to TF32; the host pass; the CPU emulation) the same
// fragments load from shared memory element by element and a product
// gathers its rows and columns by shuffles and sums them in float, k in
// order: the layouts are the same code either way, so the emulation runs
// every index a GPU computes except inside the two instructions.
//
// Operands live in shared memory; `ld` is a row's length in elements, and
// (for ldmatrix) every row must start 16 bytes aligned.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"

namespace mpiformer::cuda {

template <class T>
struct alignas(16) FragA {
  T x[8];
};
template <class T>
struct alignas(8) FragB {
  T x[4];
};
struct FragC {
  float x[4] = {0.f, 0.f, 0.f, 0.f};
};

// True where the tensor-core instructions serve T.
template <class T>
constexpr bool kTensorCores = sizeof(T) == 2;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MPIFORMER_WARP_MMA_PTX 1
__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
#endif

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % kWarp; }

// A from [m][k] storage: A(m, k) = s[m * ld + k].
template <class T>
__device__ __forceinline__ void load_a(FragA<T>& a, const T* s, int ld) {
  const int l = lane_id(), g = l / 4, q = l % 4;
#ifdef MPIFORMER_WARP_MMA_PTX
  if constexpr (kTensorCores<T>) {
    ldmatrix_x4(reinterpret_cast<uint32_t*>(a.x), s + ((l >> 3 & 1) * 8 + (l & 7)) * ld + (l >> 4) * 8);
    return;
  }
#endif
  const T* r0 = s + g * ld + 2 * q;
  const T* r1 = r0 + 8 * ld;
  a.x[0] = r0[0], a.x[1] = r0[1], a.x[2] = r1[0], a.x[3] = r1[1];
  a.x[4] = r0[8], a.x[5] = r0[9], a.x[6] = r1[8], a.x[7] = r1[9];
}

// A from [k][m] storage: A(m, k) = s[k * ld + m].
template <class T>
__device__ __forceinline__ void load_a_trans(FragA<T>& a, const T* s, int ld) {
  const int l = lane_id(), g = l / 4, q = l % 4;
#ifdef MPIFORMER_WARP_MMA_PTX
  if constexpr (kTensorCores<T>) {
    ldmatrix_x4_trans(reinterpret_cast<uint32_t*>(a.x),
                      s + ((l >> 4) * 8 + (l & 7)) * ld + (l >> 3 & 1) * 8);
    return;
  }
#endif
  const T* k0 = s + 2 * q * ld + g;
  a.x[0] = k0[0], a.x[1] = k0[ld], a.x[2] = k0[8], a.x[3] = k0[ld + 8];
  const T* k8 = k0 + 8 * ld;
  a.x[4] = k8[0], a.x[5] = k8[ld], a.x[6] = k8[8], a.x[7] = k8[ld + 8];
}

// Two B tiles side by side (n 0-7 and 8-15) from [n][k] storage:
// B(k, n) = s[n * ld + k] (keys stored a row each, read as K^T).
template <class T>
__device__ __forceinline__ void load_b_pair(FragB<T>& b0, FragB<T>& b1, const T* s, int ld) {
  const int l = lane_id(), g = l / 4, q = l % 4;
#ifdef MPIFORMER_WARP_MMA_PTX
  if constexpr (kTensorCores<T>) {
    uint32_t r[4];
    ldmatrix_x4(r, s + ((l >> 4) * 8 + (l & 7)) * ld + (l >> 3 & 1) * 8);
    reinterpret_cast<uint32_t*>(b0.x)[0] = r[0], reinterpret_cast<uint32_t*>(b0.x)[1] = r[1];
    reinterpret_cast<uint32_t*>(b1.x)[0] = r[2], reinterpret_cast<uint32_t*>(b1.x)[1] = r[3];
    return;
  }
#endif
  const T* n0 = s + g * ld + 2 * q;
  b0.x[0] = n0[0], b0.x[1] = n0[1], b0.x[2] = n0[8], b0.x[3] = n0[9];
  const T* n8 = n0 + 8 * ld;
  b1.x[0] = n8[0], b1.x[1] = n8[1], b1.x[2] = n8[8], b1.x[3] = n8[9];
}

// Two B tiles side by side from [k][n] storage: B(k, n) = s[k * ld + n].
template <class T>
__device__ __forceinline__ void load_b_trans_pair(FragB<T>& b0, FragB<T>& b1, const T* s, int ld) {
  const int l = lane_id(), g = l / 4, q = l % 4;
#ifdef MPIFORMER_WARP_MMA_PTX
  if constexpr (kTensorCores<T>) {
    uint32_t r[4];
    ldmatrix_x4_trans(r, s + ((l >> 3 & 1) * 8 + (l & 7)) * ld + (l >> 4) * 8);
    reinterpret_cast<uint32_t*>(b0.x)[0] = r[0], reinterpret_cast<uint32_t*>(b0.x)[1] = r[1];
    reinterpret_cast<uint32_t*>(b1.x)[0] = r[2], reinterpret_cast<uint32_t*>(b1.x)[1] = r[3];
    return;
  }
#endif
  const T* k0 = s + 2 * q * ld + g;
  const T* k8 = k0 + 8 * ld;
  b0.x[0] = k0[0], b0.x[1] = k0[ld], b0.x[2] = k8[0], b0.x[3] = k8[ld];
  b1.x[0] = k0[8], b1.x[1] = k0[ld + 8], b1.x[2] = k8[8], b1.x[3] = k8[ld + 8];
}

// A fragment from two C tiles (k 0-7 and 8-15 of the next product), in
// the operand type.
template <class T>
__device__ __forceinline__ FragA<T> a_from_c(const FragC& lo, const FragC& hi) {
  FragA<T> a;
  a.x[0] = from_float<T>(lo.x[0]), a.x[1] = from_float<T>(lo.x[1]);
  a.x[2] = from_float<T>(lo.x[2]), a.x[3] = from_float<T>(lo.x[3]);
  a.x[4] = from_float<T>(hi.x[0]), a.x[5] = from_float<T>(hi.x[1]);
  a.x[6] = from_float<T>(hi.x[2]), a.x[7] = from_float<T>(hi.x[3]);
  return a;
}

// A whole fragment from lane `src`, 8 bytes a shuffle.
template <class F>
__device__ __forceinline__ F shuffle_fragment(const F& f, int src) {
  static_assert(sizeof(F) % 8 == 0, "fragments move in 8-byte pieces");
  F out;
  const auto* in = reinterpret_cast<const unsigned long long*>(&f);
  auto* o = reinterpret_cast<unsigned long long*>(&out);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(F) / 8); ++i)
    o[i] = __shfl_sync(0xffffffffu, in[i], src);
  return out;
}

// c += a b.
template <class T>
__device__ __forceinline__ void mma(FragC& c, const FragA<T>& a, const FragB<T>& b) {
#ifdef MPIFORMER_WARP_MMA_PTX
  if constexpr (kTensorCores<T>) {
    const auto* ar = reinterpret_cast<const uint32_t*>(a.x);
    const auto* br = reinterpret_cast<const uint32_t*>(b.x);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
          : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
          : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]));
    }
    return;
  }
#endif
  // Rows g and g + 8 of A are held by the lanes of this lane's quad;
  // columns 2q and 2q + 1 of B by the quads 2q and 2q + 1.
  const int l = lane_id(), g = l / 4, q = l % 4;
  float arow[2][16], bcol[2][16];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const FragA<T> o = shuffle_fragment(a, 4 * g + s);
    arow[0][2 * s] = to_float(o.x[0]), arow[0][2 * s + 1] = to_float(o.x[1]);
    arow[1][2 * s] = to_float(o.x[2]), arow[1][2 * s + 1] = to_float(o.x[3]);
    arow[0][2 * s + 8] = to_float(o.x[4]), arow[0][2 * s + 9] = to_float(o.x[5]);
    arow[1][2 * s + 8] = to_float(o.x[6]), arow[1][2 * s + 9] = to_float(o.x[7]);
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const FragB<T> p = shuffle_fragment(b, 4 * (2 * q + cc) + s);
      bcol[cc][2 * s] = to_float(p.x[0]), bcol[cc][2 * s + 1] = to_float(p.x[1]);
      bcol[cc][2 * s + 8] = to_float(p.x[2]), bcol[cc][2 * s + 9] = to_float(p.x[3]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < 16; ++k) sum += arow[r][k] * bcol[cc][k];
      c.x[2 * r + cc] += sum;
    }
}

// A C tile's row is held by the four lanes of a quad: its maximum and sum.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One step of the online softmax (FlashAttention-2) over a warp's score
// tile s (16 rows by 8 NS keys, C layout): the scores scaled, those where
// hidden(n, e) says so masked; the rows' running maxima m move to the new
// ones, rescaling the lane's partial row sums l and the outputs o; s
// becomes the probabilities, P V's operand. A row with nothing seen yet
// keeps m = -inf and adds nothing.
template <int NS, int NO, class Hidden>
__device__ __forceinline__ void online_softmax_step(FragC (&s)[NS], FragC (&o)[NO], float (&m)[2],
                                                    float (&l)[2], float scale, const Hidden& hidden) {
  float mx[2] = {m[0], m[1]};
  for (int n = 0; n < NS; ++n)
    for (int e = 0; e < 4; ++e) {
      const float x = hidden(n, e) ? -INFINITY : s[n].x[e] * scale;
      s[n].x[e] = x;
      mx[e / 2] = fmaxf(mx[e / 2], x);
    }
  float alpha[2];
  for (int r = 0; r < 2; ++r) {
    mx[r] = quad_max(mx[r]);
    alpha[r] = mx[r] == -INFINITY ? 1.f : __expf(m[r] - mx[r]);
    m[r] = mx[r];
    l[r] *= alpha[r];
  }
  for (int n = 0; n < NS; ++n)
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const float p = m[r] == -INFINITY ? 0.f : __expf(s[n].x[e] - m[r]);
      s[n].x[e] = p;
      l[r] += p;
    }
  for (int n = 0; n < NO; ++n) {
    o[n].x[0] *= alpha[0], o[n].x[1] *= alpha[0];
    o[n].x[2] *= alpha[1], o[n].x[3] *= alpha[1];
  }
}

// Dynamic shared memory beyond 48 KiB (a tile kernel's) must be allowed
// per kernel, once (a function-local static per kernel: thread-safe, and
// one call each).
template <auto Kernel>
void allow_shared(size_t bytes) {
  static const bool allowed = [bytes] {
    CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(Kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)));
    return true;
  }();
  (void)allowed;
}

// ---- global memory: asynchronous tile loads and ordered accumulation ----

// dst[0, 16) = src[0, 16) bytes if `valid`, else zeros; on sm_80+ an
// asynchronous copy (cp.async, completed by async_wait), else at once.
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
#ifdef MPIFORMER_WARP_MMA_PTX
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
#else
  auto* d = static_cast<uint4*>(dst);
  *d = valid ? *static_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#endif
}
// Closes the group of copies issued so far.
__device__ __forceinline__ void async_commit() {
#ifdef MPIFORMER_WARP_MMA_PTX
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most N groups of this thread's copies are in flight.
template <int N>
__device__ __forceinline__ void async_wait() {
#ifdef MPIFORMER_WARP_MMA_PTX
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Device-scope acquire load and release store of a flag between blocks.
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
#if defined(__CUDA_ARCH__)
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#else
  return *reinterpret_cast<const volatile unsigned*>(p);
#endif
}
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#else
  *reinterpret_cast<volatile unsigned*>(p) = v;
#endif
}
// Loads and stores through L2 only: another multiprocessor wrote, or will
// read, the value, and L1 is not coherent between them.
__device__ __forceinline__ float load_l2(const float* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *p;
#endif
}
__device__ __forceinline__ void store_l2(float* p, float v) {
#if defined(__CUDA_ARCH__)
  __stcg(p, v);
#else
  *p = v;
#endif
}

}  // namespace mpiformer::cuda
