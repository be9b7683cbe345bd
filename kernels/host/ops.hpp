// The host op set: what a GptStage needs from a device, for the CPU. Its
// twin is cuda/ops.hpp; both expose the same names and signatures, each op
// taking the device's Context first, so one stage (src/model/gpt_stage.hpp)
// runs on either. What differs between devices is below this line only.
//
// T is the activation type: float (fp32 training), double (gradient
// checks), or a 16-bit storage type (bf16, fp16: storage_types.hpp), whose
// masters, gradients, moments and statistics are float (core/precision_plan.hpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "attention.hpp"
#include "attention_blocks.hpp"
#include "common/attention_storage.hpp"
#include "common/context_chunks.hpp"
#include "crossentropy.hpp"
#include "embedding.hpp"
#include "gelu.hpp"
#include "gemm.hpp"
#include "layernorm.hpp"
#include "matmul.hpp"
#include "moe_dispatch.hpp"
#include "moe_router.hpp"
#include "residual.hpp"
#include "rmsnorm.hpp"
#include "rope.hpp"
#include "swiglu.hpp"
#include "adamw.hpp"
#include "grad_compression.hpp"
#include "storage_types.hpp"

namespace mpiformer::host {

// Host memory owned by a stage, zero-initialised.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) : v_(n, T{}) {}
  T* get() { return v_.data(); }
  const T* get() const { return v_.data(); }
  size_t size() const { return v_.size(); }

 private:
  std::vector<T> v_;
};

// The host needs no stream, library handle or scratch arena: its BLAS is
// process-wide and its kernels keep their scratch in registers and on the
// stack. The type exists so the stage is written once.
struct Context {};

// A micro-batch's token ids where the kernels read them (a copy, so the
// backward needs nothing from the caller).
struct Tokens {
  Buffer<int32_t> ids;
  Tokens() = default;
  explicit Tokens(int64_t n) : ids(static_cast<size_t>(n)) {}
  const int32_t* data() const { return ids.get(); }
};

// A micro-batch's positions where documents are masked apart, or none.
inline const int32_t* data_of(const Tokens* positions) {
  return positions != nullptr ? positions->data() : nullptr;
}

template <class T>
struct Ops {
  using Act = T;                // activations and what the matmuls read
  using Acc = compute_t<T>;     // master weights, gradients, moments, statistics, losses
  using Context = host::Context;
  template <class U>
  using Buffer = host::Buffer<U>;
  // Host memory a device copies from and to (the GPU's is page-locked).
  template <class U>
  using HostBuffer = host::Buffer<U>;
  using Tokens = host::Tokens;
  static constexpr bool kHostMemory = true;
  static constexpr Element kActElement = element_of<T>();

  // ---- the device ------------------------------------------------------------
  static std::string describe(Context&) {
    if constexpr (std::is_same_v<T, double>) return "cpu fp64";
    else if constexpr (std::is_same_v<T, float>) return "cpu fp32 (" + gemm_engine() + ")";
    else {
      bool slow = false;
      return std::string("cpu ") + (std::is_same_v<T, Bf16> ? "bf16" : "fp16") + " (" +
             narrow_gemm_engine(element_of<T>(), &slow) + ")";
    }
  }
  static void* stream_handle(Context&) { return nullptr; }
  // The host never waits on a device.
  static void set_wait_check(Context&, std::function<void()>) {}
  // The peak of the products this op set runs (fp32 sgemm, or 16-bit).
  static double measure_peak_flops(Context&) {
    if constexpr (kNarrow<T>) return measure_narrow_gemm_peak(element_of<T>());
    else return measure_gemm_peak();
  }
  static double gemm_seconds() { return host::gemm_seconds(); }
  static void reset_gemm_seconds() { host::reset_gemm_seconds(); }

  // ---- memory --------------------------------------------------------------
  template <class U>
  static void fill_zero(Context&, U* p, int64_t n) {
    std::fill(p, p + n, U(0));
  }
  template <class U>
  static void copy(Context&, U* dst, const U* src, int64_t n) {
    if (n > 0 && dst != src) std::memcpy(dst, src, sizeof(U) * static_cast<size_t>(n));
  }
  // Host to device and back: the same copy here; download is complete on
  // return on every device.
  template <class U>
  static void upload(Context& c, U* dst, const U* src, int64_t n) {
    copy(c, dst, src, n);
  }
  template <class U>
  static void download(Context& c, U* dst, const U* src, int64_t n) {
    copy(c, dst, src, n);
  }
  // `grouped`: the embedding's backward will read them (the GPU groups
  // positions by token then; the host kernel needs nothing more).
  static void load_tokens(Context& c, Tokens& t, const int32_t* src, int64_t n, bool /*grouped*/) {
    copy(c, t.ids.get(), src, n);
  }
  // The activation-type copy of the master weights (mixed precision).
  static void convert(Context&, Act* dst, const Acc* src, int64_t n) { host::convert(dst, src, n); }

  // ---- the model's ops (layouts and semantics: the kernels' headers) -------
  // wte holds rows [vocab_begin, vocab_begin + vocab_rows) of the vocabulary.
  static void embedding_forward(Context&, Act* out, const Tokens& tok, const Act* wte, const Act* wpe,
                                int64_t B, int64_t Tn, int64_t C, int64_t vocab_begin,
                                int64_t vocab_rows, const Tokens* positions = nullptr,
                                bool keep_outside = false) {
    host::embedding_forward(out, tok.data(), wte, wpe, B, Tn, C, vocab_begin, vocab_rows,
                            data_of(positions), keep_outside);
  }
  // `order`: positions by the rank holding their token (host/embedding.hpp).
  static void embedding_forward_rows(Context&, Act* rows, const Tokens& tok, const Tokens& order,
                                     int64_t first, int64_t count, const Act* wte, const Act* wpe,
                                     int64_t Tn, int64_t C, int64_t vocab_begin,
                                     const Tokens* positions = nullptr,
                                     int64_t vocab_rows = host::kWholeVocabulary) {
    host::embedding_forward_rows(rows, tok.data(), order.data(), first, count, wte, wpe, Tn, C,
                                 vocab_begin, data_of(positions), vocab_rows);
  }
  static void scatter_rows(Context&, Act* out, const Act* gathered, const Tokens& order, int64_t n,
                           int64_t C) {
    host::scatter_rows(out, gathered, order.data(), n, C);
  }
  static void embedding_backward(Context&, Acc* dwte, Acc* dwpe, const Act* dout, const Tokens& tok,
                                 int64_t B, int64_t Tn, int64_t C, int64_t vocab_begin,
                                 int64_t vocab_rows, const Tokens* positions = nullptr) {
    host::embedding_backward(dwte, dwpe, dout, tok.data(), B, Tn, C, vocab_begin, vocab_rows,
                             data_of(positions));
  }
  static void layernorm_forward(Context&, Act* out, Acc* mean, Acc* rstd, const Act* inp,
                                const Act* w, const Act* b, int64_t N, int64_t C) {
    host::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  static void layernorm_backward(Context&, Act* dinp, Acc* dw, Acc* db, const Act* dout,
                                 const Act* inp, const Act* w, const Acc* mean, const Acc* rstd,
                                 int64_t N, int64_t C) {
    host::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  static void rmsnorm_forward(Context&, Act* out, Acc* rstd, const Act* inp, const Act* w,
                              int64_t N, int64_t C, double eps) {
    host::rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  static void rmsnorm_backward(Context&, Act* dinp, Acc* dw, const Act* dout, const Act* inp,
                               const Act* w, const Acc* rstd, int64_t N, int64_t C) {
    host::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  static void rope_rotate(Context&, Act* qkv, const float* table, int64_t N, int64_t Tn,
                          int64_t C, int64_t K, int64_t hs, float sign,
                          const Tokens* positions = nullptr) {
    host::rope_rotate(qkv, table, N, Tn, C, K, hs, sign, data_of(positions));
  }
  static void swiglu_forward(Context&, Act* out, const Act* inp, int64_t N, int64_t F) {
    host::swiglu_forward(out, inp, N, F);
  }
  static void swiglu_backward(Context&, Act* dinp, const Act* inp, const Act* dout, int64_t N,
                              int64_t F) {
    host::swiglu_backward(dinp, inp, dout, N, F);
  }
  // `ld`: host/matmul.hpp's (0: OC).
  static void matmul_forward(Context&, Act* out, const Act* inp, const Act* w, const Act* bias,
                             int64_t N, int64_t C, int64_t OC, int64_t ld = 0) {
    host::matmul_forward(out, inp, w, bias, N, C, OC, ld);
  }
  static void matmul_backward(Context&, Act* dinp, Acc* dw, Acc* db, const Act* dout,
                              const Act* inp, const Act* w, int64_t N, int64_t C, int64_t OC,
                              int64_t ld = 0) {
    host::matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, ld);
  }
  static void matmul_input_grad(Context&, Acc* dinp, bool accumulate, const Act* dout,
                                const Act* w, int64_t N, int64_t C, int64_t OC, int64_t ld) {
    host::matmul_input_grad(dinp, accumulate, dout, w, N, C, OC, ld);
  }
  // Keeps the probabilities (in Acc); its backward's scratch is their gradient.
  static constexpr AttentionStorage kAttention = AttentionStorage::kProbabilities;
  using AttnState = Acc;
  // C: the query channels (NH heads); NKV kv heads (host/attention.hpp).
  static void attention_forward(Context&, Act* out, Acc* att, const Act* qkv, int64_t B,
                                int64_t Tn, int64_t C, int64_t NH, int64_t NKV,
                                const Tokens* positions = nullptr) {
    host::attention_forward(out, att, qkv, B, Tn, C, NH, NKV, data_of(positions));
  }
  // `out` (the forward's output) is not needed here: the probabilities are kept.
  static void attention_backward(Context&, Act* dqkv, Acc* datt, const Act* dout, const Act* qkv,
                                 const Act* /*out*/, const Acc* att, int64_t B, int64_t Tn,
                                 int64_t C, int64_t NH, int64_t NKV,
                                 const Tokens* /*positions: the kept probabilities hold the mask*/ = nullptr) {
    host::attention_backward(dqkv, datt, dout, qkv, att, B, Tn, C, NH, NKV);
  }
  static void gelu_forward(Context&, Act* out, const Act* inp, int64_t n) {
    host::gelu_forward(out, inp, n);
  }
  static void gelu_backward(Context&, Act* dinp, const Act* inp, const Act* dout, int64_t n) {
    host::gelu_backward(dinp, inp, dout, n);
  }
  static void residual_forward(Context&, Act* out, const Act* a, const Act* b, int64_t n) {
    host::residual_forward(out, a, b, n);
  }
  // dst += src, each of Act or Acc (host/residual.hpp's add_into).
  template <class D, class S>
  static void add_into(Context&, D* dst, const S* src, int64_t n) {
    host::add_into(dst, src, n);
  }
  static void crossentropy_forward(Context&, Acc* losses, const Act* logits,
                                   const Tokens& targets, int64_t N, int64_t V, int64_t Vp) {
    host::crossentropy_forward(losses, logits, targets.data(), N, V, Vp);
  }
  static void crossentropy_forward_backward(Context&, Acc* losses, Act* logits,
                                            const Tokens& targets, int64_t N, int64_t V,
                                            int64_t Vp, Acc grad_scale) {
    host::crossentropy_forward_backward(losses, logits, targets.data(), N, V, Vp, grad_scale);
  }
  // The vocabulary-parallel cross-entropy's three passes (crossentropy.hpp).
  static void crossentropy_vp_max(Context&, Acc* rowmax, const Act* logits, int64_t N, int64_t V,
                                  int64_t Vl) {
    host::crossentropy_vp_max(rowmax, logits, N, V, Vl);
  }
  static void crossentropy_vp_sums(Context&, Acc* stats, const Act* logits, const Tokens& targets,
                                   const Acc* rowmax, int64_t N, int64_t V, int64_t Vl,
                                   int64_t v0) {
    host::crossentropy_vp_sums(stats, logits, targets.data(), rowmax, N, V, Vl, v0);
  }
  static void crossentropy_vp_finish(Context&, Acc* losses, Act* logits, const Tokens& targets,
                                     const Acc* rowmax, const Acc* stats, int64_t N, int64_t V,
                                     int64_t Vl, int64_t v0, Acc grad_scale, bool backward) {
    host::crossentropy_vp_finish(losses, logits, targets.data(), rowmax, stats, N, V, Vl, v0,
                                 grad_scale, backward);
  }

  // ---- reductions and the optimizer -----------------------------------------
  // *sum += the sum of x, in double, in index order: the logged loss is
  // reproducible bit for bit.
  // ---- context parallelism: a ring's blocks (host/attention_blocks.hpp) ------
  // The ring passes its key/value blocks in Act (a 16-bit stage's values,
  // exactly): the blocks' arithmetic widens the one it takes into the
  // scratch after the query tiles' scores.
  static int64_t ring_scratch_elements(const AttentionShape& a, int64_t n, int64_t tile) {
    return mpiformer::ring_scratch_elements(a.B, a.NKV, n, n, tile) + ring_kv_widened(a, n);
  }
  static int64_t ring_kv_widened(const AttentionShape& a, int64_t n) {
    return std::is_same_v<Act, Acc> ? 0 : a.B * n * 2 * a.K();
  }
  // `kv` as the blocks' arithmetic reads it: itself, or widened into the
  // end of `scratch` (sized by ring_scratch_elements for chunks of n rows).
  static const Acc* ring_kv(const AttentionShape& a, const Act* kv, int64_t nk, Acc* scratch,
                            int64_t n, int64_t tile) {
    if constexpr (std::is_same_v<Act, Acc>) {
      return kv;
    } else {
      Acc* wide = scratch + mpiformer::ring_scratch_elements(a.B, a.NKV, n, n, tile);
      const int64_t count = a.B * nk * 2 * a.K();
      parallel_for("widen", count, [=](const int64_t i) { wide[i] = static_cast<Acc>(ld(kv[i])); });
      return wide;
    }
  }
  static void ring_start(Context&, const AttentionShape& a, int64_t nq, Acc* m, Acc* l, Acc* o) {
    host::ring_attention_start(a, nq, m, l, o);
  }
  // (n: the ring's chunk rows, what the scratch was sized for.)
  static void ring_forward(Context&, const AttentionShape& a, const Acc* qkv, int64_t q0, int64_t nq,
                           const Act* kv, int64_t k0, int64_t nk, Acc* m, Acc* l, Acc* o,
                           Acc* scratch, const int64_t* starts, int64_t tile, int64_t n) {
    host::ring_attention_forward(a, qkv, q0, nq, ring_kv(a, kv, nk, scratch, n, tile), k0, nk, m, l, o,
                                 scratch, starts, tile);
  }
  static void ring_finish(Context&, const AttentionShape& a, int64_t nq, Acc* o, const Acc* m,
                          const Acc* l, Acc* lse) {
    host::ring_attention_finish(a, nq, o, m, l, lse);
  }
  static void ring_delta(Context&, const AttentionShape& a, int64_t nq, const Acc* out,
                         const Acc* dout, Acc* delta) {
    host::ring_attention_delta(a, nq, out, dout, delta);
  }
  static void ring_backward(Context&, const AttentionShape& a, const Acc* qkv, int64_t q0,
                            int64_t nq, const Act* kv, int64_t k0, int64_t nk, const Acc* dout,
                            const Acc* lse, const Acc* delta, Acc* dqkv, Acc* dkv, Acc* scratch,
                            const int64_t* starts, int64_t tile, int64_t n) {
    host::ring_attention_backward(a, qkv, q0, nq, ring_kv(a, kv, nk, scratch, n, tile), k0, nk, dout,
                                  lse, delta, dqkv, dkv, scratch, starts, tile);
  }
  // rows x width elements between buffers of leading dimensions ld_dst, ld_src.
  template <class U>
  static void copy_rows(Context&, U* dst, int64_t ld_dst, const U* src, int64_t ld_src,
                        int64_t rows, int64_t width) {
    for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * ld_src, width, dst + r * ld_dst);
  }
  // Each row's document's first position in the sequence
  // (common/context_chunks.hpp).
  static void ring_document_starts(Context&, int64_t* starts, const int32_t* positions, int64_t B,
                                   int64_t n, int64_t first, int64_t second) {
    for (int64_t row = 0; row < 2 * B * n; ++row)
      starts[row] = context_document_start(row, B, n, first, second, positions[row]);
  }

  // ---- Mixture of Experts (host/moe_router.hpp, host/moe_dispatch.hpp) -----
  // The router reads its logits in Acc: widen them from its GEMM's Act.
  static void widen(Context&, Acc* dst, const Act* src, int64_t n) {
    parallel_for("widen", n, [=](const int64_t i) { dst[i] = static_cast<Acc>(ld(src[i])); });
  }
  static size_t router_scratch_bytes(const RouterShape& r) { return host::router_scratch_bytes(r); }
  static void router_forward(Context&, const RouterShape& r, const Acc* logits, Acc* probs,
                             Acc* lse, int32_t* expert, Acc* gate, int32_t* dest, int32_t* chose,
                             int64_t* kept, double* totals, void* scratch,
                             const RouterExchange* exchange) {
    host::router_forward(r, logits, probs, lse, expert, gate, dest, chose, kept, totals, scratch,
                         exchange);
  }
  static void router_backward(Context&, const RouterShape& r, Acc* dlogits, const Acc* dgate,
                              const Acc* probs, const Acc* lse, const int32_t* expert,
                              const Acc* gate, const int32_t* chose, Acc aux_scale, Acc z_scale) {
    host::router_backward(r, dlogits, dgate, probs, lse, expert, gate, chose, aux_scale, z_scale);
  }
  static void moe_dispatch_forward(Context&, Act* buf, const Act* x, const int32_t* dest,
                                   int64_t N, int64_t K, int64_t C) {
    host::moe_dispatch_forward(buf, x, dest, N, K, C);
  }
  static void moe_dispatch_backward(Context&, Act* dx, const Act* dbuf, const int32_t* dest,
                                    int64_t N, int64_t K, int64_t C) {
    host::moe_dispatch_backward(dx, dbuf, dest, N, K, C);
  }
  static void moe_combine_forward(Context&, Act* y, const Act* out, const Acc* gate,
                                  const int32_t* dest, int64_t N, int64_t K, int64_t C) {
    host::moe_combine_forward(y, out, gate, dest, N, K, C);
  }
  static void moe_combine_backward(Context&, Act* dout, Acc* dgate, const Act* dy, const Act* out,
                                   const Acc* gate, const int32_t* dest, int64_t N, int64_t K,
                                   int64_t C) {
    host::moe_combine_backward(dout, dgate, dy, out, gate, dest, N, K, C);
  }

  static void accumulate_sum(Context&, double* sum, const Acc* x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
    *sum += s;
  }
  // A value the device accumulated (a loss sum), on the host.
  static double read(Context&, const double* value) { return *value; }
  // Of Acc, or of Act (16-bit gradients).
  template <class X>
  static double sum_of_squares(Context&, const X* x, int64_t n) {
    return host::sum_of_squares(x, n);
  }
  // `weights`: the Act copy the matmuls read, refreshed chunk by chunk
  // (mixed precision); in fp32 and fp64 the weights are the masters.
  // `grads16`: where the chunks flagged `narrow` read their gradients
  // ([train] grad_dtype = bf16 at zero 1), the others reading `grads`.
  static void adamw(Context&, Acc* params, const Acc* grads, Acc* m, Acc* v,
                    const AdamWChunk* chunks, int64_t count, const AdamWParams& p, Act* weights,
                    const Act* grads16 = nullptr) {
    host::adamw_update_chunks(params, grads, m, v, chunks, count, p,
                              std::is_same_v<Act, Acc> ? nullptr : weights, grads16);
  }
  // The compressed all-reduce's kernels (host/grad_compression.hpp).
  static void compress_with_feedback(Context&, bool int8, const float* g, float* residual,
                                     int64_t n, int parts, uint8_t* wire) {
    host::compress_with_feedback(int8, g, residual, n, parts, wire);
  }
  static void sum_compressed(Context&, bool int8, const uint8_t* wire, int parts, int64_t c,
                             int64_t valid, float* residual, uint8_t* out) {
    host::sum_compressed(int8, wire, parts, c, valid, residual, out);
  }
  static void expand_compressed(Context&, bool int8, const uint8_t* wire, int parts, int64_t n,
                                float* out) {
    host::expand_compressed(int8, wire, parts, n, out);
  }
};

}  // namespace mpiformer::host
