// The CUDA op set: the twin of host/ops.hpp (same names, same signatures,
// the device's Context first), so one GptStage runs on either device. Every
// op is queued on the context's stream; nothing here synchronises except
// download and the reductions that return a value to the host.
//
// A is the activation type: float, or bf16 for mixed precision, where
// activations and the weights the matmuls read are bf16 while the master
// weights, their gradients, the moments, LayerNorm statistics and losses
// stay float.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>

#include "common/attention_storage.hpp"
#include "cuda/adamw.hpp"
#include "cuda/grad_compression.hpp"
#include "cuda/attention.hpp"
#include "cuda/context.hpp"
#include "cuda/crossentropy.hpp"
#include "core/cuda_check.hpp"
#include "core/precision_plan.hpp"
#include "cuda/embedding.hpp"
#include "cuda/gelu.hpp"
#include "cuda/layernorm.hpp"
#include "cuda/rmsnorm.hpp"
#include "cuda/rope.hpp"
#include "cuda/swiglu.hpp"
#include "cuda/matmul.hpp"
#include "cuda/moe_dispatch.hpp"
#include "cuda/moe_router.hpp"
#include "cuda/reduce.hpp"
#include "cuda/residual.hpp"
#include "cuda/ring_attention.hpp"

namespace mpiformer::cuda {

// A micro-batch's positions where documents are masked apart, or none.
inline const int32_t* data_of(const Tokens* positions) {
  return positions != nullptr ? positions->data() : nullptr;
}

template <class A>
struct Ops {
  using Act = A;
  using Acc = float;
  using Context = cuda::Context;
  template <class U>
  using Buffer = DeviceBuffer<U>;
  // Page-locked host memory, so the copies below overlap host work.
  template <class U>
  using HostBuffer = PinnedBuffer<U>;
  using Tokens = cuda::Tokens;
  static constexpr bool kHostMemory = false;
  static constexpr Element kActElement = std::is_same_v<A, float>  ? Element::kF32
                                         : std::is_same_v<A, bf16> ? Element::kBf16
                                                                   : Element::kF16;

  // ---- the device ------------------------------------------------------------
  static std::string describe(Context& c) {
    return std::string("cuda ") +
           (std::is_same_v<A, float> ? "fp32" : std::is_same_v<A, bf16> ? "bf16" : "fp16") + " (" +
           c.device_name() + ", device " + std::to_string(c.device()) + ")";
  }
  static void* stream_handle(Context& c) { return c.stream(); }
  static double allocated_peak_bytes() { return static_cast<double>(device_allocated_peak()); }
  static void set_wait_check(Context& c, std::function<void()> check) {
    c.set_wait_check(std::move(check));
  }
  static double measure_peak_flops(Context&) { return measure_gemm_peak(dtype_of<A>()); }
  // Products run asynchronously: not timed.
  static double gemm_seconds() { return std::numeric_limits<double>::quiet_NaN(); }
  static void reset_gemm_seconds() {}

  // ---- memory (all on the stream) ------------------------------------------
  template <class U>
  static void fill_zero(Context& c, U* p, int64_t n) {
    if (n > 0) CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(U) * static_cast<size_t>(n), c.stream()));
  }
  template <class U>
  static void copy(Context& c, U* dst, const U* src, int64_t n) {
    if (n > 0 && dst != src)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(U) * static_cast<size_t>(n),
                                 cudaMemcpyDeviceToDevice, c.stream()));
  }
  // From pageable host memory: returns once `src` has been read.
  template <class U>
  static void upload(Context& c, U* dst, const U* src, int64_t n) {
    if (n > 0)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(U) * static_cast<size_t>(n),
                                 cudaMemcpyHostToDevice, c.stream()));
  }
  // Complete on return.
  template <class U>
  static void download(Context& c, U* dst, const U* src, int64_t n) {
    if (n > 0)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(U) * static_cast<size_t>(n),
                                 cudaMemcpyDeviceToHost, c.stream()));
    c.synchronize();
  }
  // To a HostBuffer, queued: complete once synchronize() returns. (upload
  // from a HostBuffer is queued likewise: its source must stay untouched
  // until then.)
  template <class U>
  static void download_start(Context& c, U* dst, const U* src, int64_t n) {
    if (n > 0)
      CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(U) * static_cast<size_t>(n),
                                 cudaMemcpyDeviceToHost, c.stream()));
  }
  static void synchronize(Context& c) { c.synchronize(); }
  // The offloaded optimizer's copy streams (cuda/offload_copies.hpp).
  static OffloadCopies& offload_copies(Context& c) { return c.offload_copies(); }
  static void load_tokens(Context& c, Tokens& t, const int32_t* src, int64_t n, bool grouped) {
    t.load(c, src, n, grouped);
  }
  // The activation-type copy of the master weights (bf16 runs).
  static void convert(Context& c, A* dst, const float* src, int64_t n) {
    cuda::convert(dst, src, n, c.stream());
  }

  // ---- the model's ops -------------------------------------------------------
  static void embedding_forward(Context& c, A* out, const Tokens& tok, const A* wte, const A* wpe,
                                int64_t B, int64_t T, int64_t C, int64_t vocab_begin,
                                int64_t vocab_rows, const Tokens* positions = nullptr,
                                bool keep_outside = false) {
    cuda::embedding_forward(out, tok.data(), wte, wpe, B, T, C, vocab_begin, vocab_rows,
                            c.stream(), data_of(positions), keep_outside);
  }
  static void embedding_forward_rows(Context& c, A* rows, const Tokens& tok, const Tokens& order,
                                     int64_t first, int64_t count, const A* wte, const A* wpe,
                                     int64_t T, int64_t C, int64_t vocab_begin,
                                     const Tokens* positions = nullptr,
                                     int64_t vocab_rows = std::numeric_limits<int64_t>::max()) {
    cuda::embedding_forward_rows(rows, tok.data(), order.data(), first, count, wte, wpe, T, C,
                                 vocab_begin, c.stream(), data_of(positions), vocab_rows);
  }
  static void scatter_rows(Context& c, A* out, const A* gathered, const Tokens& order, int64_t n,
                           int64_t C) {
    cuda::scatter_rows(out, gathered, order.data(), n, C, c.stream());
  }
  static void embedding_backward(Context& c, float* dwte, float* dwpe, const A* dout,
                                 const Tokens& tok, int64_t B, int64_t T, int64_t C,
                                 int64_t vocab_begin, int64_t vocab_rows,
                                 const Tokens* positions = nullptr) {
    // The positions were loaded grouped where the stage has a wpe.
    const DeviceTokenGroups by_position = positions != nullptr && dwpe != nullptr
                                              ? positions->groups()
                                              : DeviceTokenGroups{};
    cuda::embedding_backward(dwte, dwpe, dout, tok.groups(), B, T, C, vocab_begin, vocab_rows,
                             c.stream(), positions != nullptr && dwpe != nullptr ? &by_position : nullptr);
  }
  static void layernorm_forward(Context& c, A* out, float* mean, float* rstd, const A* inp,
                                const A* w, const A* b, int64_t N, int64_t C) {
    cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, c.stream());
  }
  static void layernorm_backward(Context& c, A* dinp, float* dw, float* db, const A* dout,
                                 const A* inp, const A* w, const float* mean, const float* rstd,
                                 int64_t N, int64_t C) {
    cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, c.blas().scratch(),
                             c.stream());
  }
  static void rmsnorm_forward(Context& c, A* out, float* rstd, const A* inp, const A* w,
                              int64_t N, int64_t C, double eps) {
    cuda::rmsnorm_forward(out, rstd, inp, w, N, C, static_cast<float>(eps), c.stream());
  }
  static void rmsnorm_backward(Context& c, A* dinp, float* dw, const A* dout, const A* inp,
                               const A* w, const float* rstd, int64_t N, int64_t C) {
    cuda::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, c.blas().scratch(), c.stream());
  }
  static void rope_rotate(Context& c, A* qkv, const float* table, int64_t N, int64_t T,
                          int64_t C, int64_t K, int64_t hs, float sign,
                          const Tokens* positions = nullptr) {
    cuda::rope_rotate(qkv, table, N, T, C, K, hs, sign, c.stream(), data_of(positions));
  }
  static void swiglu_forward(Context& c, A* out, const A* inp, int64_t N, int64_t F) {
    cuda::swiglu_forward(out, inp, N, F, c.stream());
  }
  static void swiglu_backward(Context& c, A* dinp, const A* inp, const A* dout, int64_t N,
                              int64_t F) {
    cuda::swiglu_backward(dinp, inp, dout, N, F, c.stream());
  }
  static void matmul_forward(Context& c, A* out, const A* inp, const A* w, const A* bias,
                             int64_t N, int64_t C, int64_t OC, int64_t ld = 0) {
    cuda::matmul_forward(c.blas(), out, inp, w, bias, N, C, OC, ld);
  }
  static void matmul_backward(Context& c, A* dinp, float* dw, float* db, const A* dout,
                              const A* inp, const A* w, int64_t N, int64_t C, int64_t OC,
                              int64_t ld = 0) {
    cuda::matmul_backward(c.blas(), dinp, dw, db, dout, inp, w, N, C, OC, ld);
  }
  static void matmul_input_grad(Context& c, float* dinp, bool accumulate, const A* dout,
                                const A* w, int64_t N, int64_t C, int64_t OC, int64_t ld) {
    cuda::matmul_input_grad(c.blas(), dinp, accumulate, dout, w, N, C, OC, ld);
  }
  // Fused (cuda/attention.hpp): keeps each row's log-sum-exp, not the
  // probabilities; its backward's scratch is attention_scratch_elements.
  static constexpr AttentionStorage kAttention = AttentionStorage::kRowStatistics;
  using AttnState = float;
  static void attention_forward(Context& c, A* out, float* lse, const A* qkv, int64_t B,
                                int64_t T, int64_t C, int64_t NH, int64_t NKV,
                                const Tokens* positions = nullptr) {
    cuda::attention_forward(out, lse, qkv, B, T, C, NH, NKV, c.stream(), data_of(positions));
  }
  static void attention_backward(Context& c, A* dqkv, float* scratch, const A* dout, const A* qkv,
                                 const A* out, const float* lse, int64_t B, int64_t T, int64_t C,
                                 int64_t NH, int64_t NKV, const Tokens* positions = nullptr) {
    cuda::attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, NKV, c.stream(),
                             data_of(positions));
  }
  static void gelu_forward(Context& c, A* out, const A* inp, int64_t n) {
    cuda::gelu_forward(out, inp, n, c.stream());
  }
  static void gelu_backward(Context& c, A* dinp, const A* inp, const A* dout, int64_t n) {
    cuda::gelu_backward(dinp, inp, dout, n, c.stream());
  }
  static void residual_forward(Context& c, A* out, const A* a, const A* b, int64_t n) {
    cuda::residual_forward(out, a, b, n, c.stream());
  }
  // dst += src, each of A or float (cuda/residual.hpp's add_into).
  template <class D, class S>
  static void add_into(Context& c, D* dst, const S* src, int64_t n) {
    cuda::add_into(dst, src, n, c.stream());
  }
  static void crossentropy_forward(Context& c, float* losses, const A* logits,
                                   const Tokens& targets, int64_t N, int64_t V, int64_t Vp) {
    cuda::crossentropy_forward(losses, logits, targets.data(), N, V, Vp, c.stream());
  }
  static void crossentropy_forward_backward(Context& c, float* losses, A* logits,
                                            const Tokens& targets, int64_t N, int64_t V,
                                            int64_t Vp, float grad_scale) {
    cuda::crossentropy_forward_backward(losses, logits, targets.data(), N, V, Vp, grad_scale,
                                        c.stream());
  }
  static void crossentropy_vp_max(Context& c, float* rowmax, const A* logits, int64_t N, int64_t V,
                                  int64_t Vl) {
    cuda::crossentropy_vp_max(rowmax, logits, N, V, Vl, c.stream());
  }
  static void crossentropy_vp_sums(Context& c, float* stats, const A* logits, const Tokens& targets,
                                   const float* rowmax, int64_t N, int64_t V, int64_t Vl,
                                   int64_t v0) {
    cuda::crossentropy_vp_sums(stats, logits, targets.data(), rowmax, N, V, Vl, v0, c.stream());
  }
  static void crossentropy_vp_finish(Context& c, float* losses, A* logits, const Tokens& targets,
                                     const float* rowmax, const float* stats, int64_t N, int64_t V,
                                     int64_t Vl, int64_t v0, float grad_scale, bool backward) {
    cuda::crossentropy_vp_finish(losses, logits, targets.data(), rowmax, stats, N, V, Vl, v0,
                                 grad_scale, backward, c.stream());
  }

  // ---- context parallelism: a ring's blocks (cuda/ring_attention.hpp) --------
  // (No scratch: a warp per row keeps its scores in registers.)
  static int64_t ring_scratch_elements(const AttentionShape&, int64_t, int64_t) { return 0; }
  static void ring_start(Context& c, const AttentionShape& a, int64_t nq, float* m, float* l,
                         float* o) {
    cuda::ring_attention_start(a, nq, m, l, o, c.stream());
  }
  // The key/value blocks in A: a 16-bit stage's ring passes them so.
  static void ring_forward(Context& c, const AttentionShape& a, const float* qkv, int64_t q0,
                           int64_t nq, const A* kv, int64_t k0, int64_t nk, float* m, float* l,
                           float* o, float*, const int64_t* starts, int64_t, int64_t) {
    cuda::ring_attention_forward<A>(a, qkv, q0, nq, kv, k0, nk, m, l, o, c.stream(), starts);
  }
  static void ring_finish(Context& c, const AttentionShape& a, int64_t nq, float* o, const float* m,
                          const float* l, float* lse) {
    cuda::ring_attention_finish(a, nq, o, m, l, lse, c.stream());
  }
  static void ring_delta(Context& c, const AttentionShape& a, int64_t nq, const float* out,
                         const float* dout, float* delta) {
    cuda::ring_attention_delta(a, nq, out, dout, delta, c.stream());
  }
  static void ring_backward(Context& c, const AttentionShape& a, const float* qkv, int64_t q0,
                            int64_t nq, const A* kv, int64_t k0, int64_t nk, const float* dout,
                            const float* lse, const float* delta, float* dqkv, float* dkv, float*,
                            const int64_t* starts, int64_t, int64_t) {
    cuda::ring_attention_backward<A>(a, qkv, q0, nq, kv, k0, nk, dout, lse, delta, dqkv, dkv,
                                  c.stream(), starts);
  }
  template <class U>
  static void copy_rows(Context& c, U* dst, int64_t ld_dst, const U* src, int64_t ld_src,
                        int64_t rows, int64_t width) {
    cuda::copy_rows(dst, ld_dst, src, ld_src, rows, width, c.stream());
  }
  static void ring_document_starts(Context& c, int64_t* starts, const int32_t* positions, int64_t B,
                                   int64_t n, int64_t first, int64_t second) {
    cuda::ring_document_starts(starts, positions, B, n, first, second, c.stream());
  }

  // ---- Mixture of Experts (cuda/moe_router.hpp, cuda/moe_dispatch.hpp) -------
  static void widen(Context& c, float* dst, const A* src, int64_t n) {
    cuda::widen(dst, src, n, c.stream());
  }
  static size_t router_scratch_bytes(const RouterShape& r) { return cuda::router_scratch_bytes(r); }
  static void router_forward(Context& c, const RouterShape& r, const float* logits, float* probs,
                             float* lse, int32_t* expert, float* gate, int32_t* dest,
                             int32_t* chose, int64_t* kept, double* totals, void* scratch,
                             const RouterExchange* exchange) {
    cuda::router_forward(r, logits, probs, lse, expert, gate, dest, chose, kept, totals, scratch,
                         c.stream(), exchange);
  }
  static void router_backward(Context& c, const RouterShape& r, float* dlogits,
                              const float* dgate, const float* probs, const float* lse,
                              const int32_t* expert, const float* gate, const int32_t* chose,
                              float aux_scale, float z_scale) {
    cuda::router_backward(r, dlogits, dgate, probs, lse, expert, gate, chose, aux_scale, z_scale,
                          c.stream());
  }
  static void moe_dispatch_forward(Context& c, A* buf, const A* x, const int32_t* dest, int64_t N,
                                   int64_t K, int64_t C) {
    cuda::moe_dispatch_forward(buf, x, dest, N, K, C, c.stream());
  }
  static void moe_dispatch_backward(Context& c, A* dx, const A* dbuf, const int32_t* dest,
                                    int64_t N, int64_t K, int64_t C) {
    cuda::moe_dispatch_backward(dx, dbuf, dest, N, K, C, c.stream());
  }
  static void moe_combine_forward(Context& c, A* y, const A* out, const float* gate,
                                  const int32_t* dest, int64_t N, int64_t K, int64_t C) {
    cuda::moe_combine_forward(y, out, gate, dest, N, K, C, c.stream());
  }
  static void moe_combine_backward(Context& c, A* dout, float* dgate, const A* dy, const A* out,
                                   const float* gate, const int32_t* dest, int64_t N, int64_t K,
                                   int64_t C) {
    cuda::moe_combine_backward(dout, dgate, dy, out, gate, dest, N, K, C, c.stream());
  }

  // ---- reductions and the optimizer ------------------------------------------
  // *sum (device) += the sum of x, in double, in a fixed order.
  static void accumulate_sum(Context& c, double* sum, const float* x, int64_t n) {
    reduce_sum(sum, x, n, false, true, c.reduce_scratch(), c.stream());
  }
  // Wait for the stream: the value goes to the host.
  static double read(Context& c, const double* value) { return c.read(value); }
  // Of floats, or of A (16-bit gradients).
  template <class X>
  static double sum_of_squares(Context& c, const X* x, int64_t n) {
    reduce_sum(c.reduce_result(), x, n, true, false, c.reduce_scratch(), c.stream());
    return c.read(c.reduce_result());
  }
  // `grads16`: where the chunks flagged `narrow` read their gradients (A;
  // [train] grad_dtype = bf16 at zero 1), the others reading `grads`.
  static void adamw(Context& c, float* params, const float* grads, float* m, float* v,
                    const AdamWChunk* chunks, int64_t count, const AdamWParams& p, A* weights,
                    const A* grads16 = nullptr) {
    A* copy = std::is_same_v<A, float> ? nullptr : weights;
    adamw_update_chunks(params, grads, m, v, chunks, count, p, copy, c.stream(), grads16);
  }
  // The compressed all-reduce's kernels (cuda/grad_compression.hpp).
  static void compress_with_feedback(Context& c, bool int8, const float* g, float* residual,
                                     int64_t n, int parts, uint8_t* wire) {
    cuda::compress_with_feedback(int8, g, residual, n, parts, wire, c.stream());
  }
  static void sum_compressed(Context& c, bool int8, const uint8_t* wire, int parts, int64_t cn,
                             int64_t valid, float* residual, uint8_t* out) {
    cuda::sum_compressed(int8, wire, parts, cn, valid, residual, out, c.stream());
  }
  static void expand_compressed(Context& c, bool int8, const uint8_t* wire, int parts, int64_t n,
                                float* out) {
    cuda::expand_compressed(int8, wire, parts, n, out, c.stream());
  }

};

}  // namespace mpiformer::cuda
