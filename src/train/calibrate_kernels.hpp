// `mpiformer calibrate`'s compute measurements, written once over an op set
// (host::Ops on the CPU, cuda::Ops on a GPU): the stage's matmuls at given
// shapes, attention per (batch, head), and the non-GEMM kernels' bandwidth,
// each through the very op the stage calls, on buffers of the op set's
// types, cycled so that each call reads data another call touched last.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "core/gpt_config.hpp"
#include "machine_file.hpp"
#include "common/adamw_params.hpp"
#include "model/stage_work.hpp"
#include "train/calibrate_progress.hpp"
#include "train/calibration_timing.hpp"

namespace mpiformer::calibration {

// Where the measurements run: the op set's context, and how to wait for
// what it queued.
template <class Ops>
struct OpBench {
  typename Ops::Context& ctx;
  std::function<void()> fence;

  template <class U>
  using Buffer = typename Ops::template Buffer<U>;

  // A buffer of n elements holding values() in its type.
  template <class U>
  Buffer<U> filled(double n) const {
    const std::vector<float> v = values(n);
    std::vector<U> u(v.size());
    for (size_t i = 0; i < v.size(); ++i) u[i] = static_cast<U>(v[i]);
    Buffer<U> b(u.size());
    Ops::upload(ctx, b.get(), u.data(), static_cast<int64_t>(u.size()));
    return b;
  }
  template <class F>
  double seconds(double budget, F&& f) const {
    return seconds_per_call(MPI_COMM_WORLD, budget, std::forward<F>(f), fence);
  }
};

template <class Ops>
MatmulPoint measure_matmul(const OpBench<Ops>& d, int64_t m, int64_t k, int64_t n, double budget) {
  using A = typename Ops::Act;
  using F = typename Ops::Acc;
  struct Set {
    typename OpBench<Ops>::template Buffer<A> inp, w, bias, out, dinp, dout;
    typename OpBench<Ops>::template Buffer<F> dw, db;
  };
  const int K = copies(static_cast<double>(sizeof(A)) * static_cast<double>(2 * m * k + 2 * n * k + 2 * m * n));
  std::vector<Set> sets;
  for (int i = 0; i < K; ++i)
    sets.push_back({d.template filled<A>(m * k), d.template filled<A>(n * k), d.template filled<A>(n),
                    d.template filled<A>(m * n), d.template filled<A>(m * k), d.template filled<A>(m * n),
                    d.template filled<F>(n * k), d.template filled<F>(n)});
  int next = 0;
  MatmulPoint p{m, k, n, 0, 0};
  p.forward = d.seconds(budget, [&] {
    Set& x = sets[next++ % K];
    Ops::matmul_forward(d.ctx, x.out.get(), x.inp.get(), x.w.get(), x.bias.get(), m, k, n);
  });
  p.backward = d.seconds(budget, [&] {
    Set& x = sets[next++ % K];
    Ops::matmul_backward(d.ctx, x.dinp.get(), x.dw.get(), x.db.get(), x.dout.get(), x.inp.get(),
                         x.w.get(), m, k, n);
  });
  return p;
}

// Seconds per (batch, head) pair: 8 pairs of one sequence at once, with
// what the op set's attention keeps (common/attention_storage.hpp).
template <class Ops>
AttentionPoint measure_attention(const OpBench<Ops>& d, int64_t hs, int64_t T, double budget) {
  using A = typename Ops::Act;
  using S = typename Ops::AttnState;
  const int64_t pairs = 8, C = pairs * hs;
  const int64_t state = attention_state_elements(Ops::kAttention, int64_t{1}, pairs, T);
  const int64_t scratch = attention_scratch_elements(Ops::kAttention, int64_t{1}, pairs, T, hs);
  struct Set {
    typename OpBench<Ops>::template Buffer<A> qkv, out, dqkv, dout;
    typename OpBench<Ops>::template Buffer<S> att, datt;
  };
  const int K = copies(static_cast<double>(sizeof(A)) * static_cast<double>(8 * T * C) +
                       static_cast<double>(sizeof(S) * (state + scratch)));
  std::vector<Set> sets;
  for (int i = 0; i < K; ++i)
    sets.push_back({d.template filled<A>(T * 3 * C), d.template filled<A>(T * C),
                    d.template filled<A>(T * 3 * C), d.template filled<A>(T * C),
                    d.template filled<S>(state), d.template filled<S>(scratch)});
  int next = 0;
  AttentionPoint p{hs, T, 0, 0};
  p.forward = d.seconds(budget, [&] {
    Set& x = sets[next++ % K];
    Ops::attention_forward(d.ctx, x.out.get(), x.att.get(), x.qkv.get(), 1, T, C, pairs, pairs);
  }) / pairs;
  // The backward on what a forward left (lse must be the forward's: a
  // made-up one overflows exp).
  for (Set& x : sets) Ops::attention_forward(d.ctx, x.out.get(), x.att.get(), x.qkv.get(), 1, T, C, pairs, pairs);
  p.backward = d.seconds(budget, [&] {
    Set& x = sets[next++ % K];
    Ops::attention_backward(d.ctx, x.dqkv.get(), x.datt.get(), x.dout.get(), x.qkv.get(),
                            x.out.get(), x.att.get(), 1, T, C, pairs, pairs);
  }) / pairs;
  return p;
}

// Each non-GEMM kernel over about `elements`, as bytes/s by the byte count
// stage_work prices it with (kernel_arrays, in the activation type's
// bytes), each call on buffers another call touched last.
template <class Ops>
KernelRow measure_kernels(const OpBench<Ops>& d, double elements, const GptConfig& cfg,
                          double budget) {
  using A = typename Ops::Act;
  using F = typename Ops::Acc;
  const int64_t C = cfg.n_embd, T = cfg.seq_len, Vp = cfg.padded_vocab();
  const int64_t N = std::max<int64_t>(1, static_cast<int64_t>(elements) / C);
  const double e = static_cast<double>(N * C);
  KernelRow row;
  row.elements = e;
  const int K = copies(4.0 * static_cast<double>(sizeof(A)) * e);
  // x, y, z for the activation kernels; p, g, m, v for AdamW (v >= 0).
  struct Set {
    typename OpBench<Ops>::template Buffer<A> x, y, z;
    typename OpBench<Ops>::template Buffer<F> p, g, m, v;
  };
  const std::vector<F> positive(static_cast<size_t>(e), F(1e-4f));
  std::vector<Set> sets;
  for (int i = 0; i < K; ++i) {
    sets.push_back({d.template filled<A>(e), d.template filled<A>(e), d.template filled<A>(e),
                    d.template filled<F>(e), d.template filled<F>(e), d.template filled<F>(e),
                    d.template filled<F>(e)});
    Ops::upload(d.ctx, sets.back().v.get(), positive.data(), static_cast<int64_t>(e));
  }
  int next = 0;
  auto rate = [&](Kernel k, bool bwd, double count, auto&& f) {
    row.bandwidth[kernel_rate_name(k, bwd)] =
        count * kernel_arrays(k, bwd) * static_cast<double>(sizeof(A)) /
        d.seconds(budget, [&] { f(sets[next++ % K]); });
  };
  auto w = d.template filled<A>(C), b = d.template filled<A>(C);
  auto mean = d.template filled<F>(N), rstd = d.template filled<F>(N);
  auto dw = d.template filled<F>(C), db = d.template filled<F>(C);
  rate(Kernel::kLayernorm, false, e, [&](Set& s) {
    Ops::layernorm_forward(d.ctx, s.y.get(), mean.get(), rstd.get(), s.x.get(), w.get(), b.get(), N, C);
  });
  rate(Kernel::kLayernorm, true, e, [&](Set& s) {
    Ops::layernorm_backward(d.ctx, s.z.get(), dw.get(), db.get(), s.y.get(), s.x.get(), w.get(),
                            mean.get(), rstd.get(), N, C);
  });
  rate(Kernel::kGelu, false, e, [&](Set& s) { Ops::gelu_forward(d.ctx, s.y.get(), s.x.get(), N * C); });
  rate(Kernel::kGelu, true, e,
       [&](Set& s) { Ops::gelu_backward(d.ctx, s.z.get(), s.x.get(), s.y.get(), N * C); });
  rate(Kernel::kResidual, false, e,
       [&](Set& s) { Ops::residual_forward(d.ctx, s.z.get(), s.x.get(), s.y.get(), N * C); });
  // Embedding: rows of positions within one sequence, tokens spread over
  // the vocabulary.
  const int64_t B = std::max<int64_t>(1, N / T), Tn = std::min(N, T);
  std::vector<int32_t> ids(static_cast<size_t>(B * Tn));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % cfg.vocab_size);
  typename Ops::Tokens tokens(B * Tn);
  Ops::load_tokens(d.ctx, tokens, ids.data(), B * Tn, true);
  auto wte = d.template filled<A>(Vp * C), wpe = d.template filled<A>(T * C);
  auto dwte = d.template filled<F>(Vp * C), dwpe = d.template filled<F>(T * C);
  const double be = static_cast<double>(B * Tn * C);
  rate(Kernel::kEmbedding, false, be, [&](Set& s) {
    Ops::embedding_forward(d.ctx, s.y.get(), tokens, wte.get(), wpe.get(), B, Tn, C, 0, Vp);
  });
  rate(Kernel::kEmbedding, true, be, [&](Set& s) {
    Ops::embedding_backward(d.ctx, dwte.get(), dwpe.get(), s.y.get(), tokens, B, Tn, C, 0, Vp);
  });
  // Cross-entropy over rows of the padded vocabulary, as many elements.
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(e) / Vp);
  auto losses = d.template filled<F>(rows);
  std::vector<int32_t> ones(static_cast<size_t>(rows), 1);
  typename Ops::Tokens targets(rows);
  Ops::load_tokens(d.ctx, targets, ones.data(), rows, false);
  rate(Kernel::kCrossentropy, false, static_cast<double>(rows * Vp), [&](Set& s) {
    Ops::crossentropy_forward_backward(d.ctx, losses.get(), s.z.get(), targets, rows,
                                       cfg.vocab_size, Vp, F(1e-3f));
  });
  // AdamW: 7 arrays of fp32 per element (p, g, m, v read; p, m, v written),
  // and on a bf16 run the weights' bf16 copy written too (not counted).
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, 0, N * C, true);
  typename OpBench<Ops>::template Buffer<AdamWChunk> device_chunks(chunks.size());
  Ops::upload(d.ctx, device_chunks.get(), chunks.data(), static_cast<int64_t>(chunks.size()));
  const AdamWParams ap{1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0};
  row.bandwidth["adamw"] = e * 7 * sizeof(float) / d.seconds(budget, [&] {
    Set& s = sets[next++ % K];
    Ops::adamw(d.ctx, s.p.get(), s.g.get(), s.m.get(), s.v.get(), device_chunks.get(),
               static_cast<int64_t>(chunks.size()), ap, s.x.get());
  });
  return row;
}

// What to measure for the requested models: matmul shapes (m, k, n) of
// every linear of each model for each tensor-parallel width and rows from
// one sequence to the global batch (at most ~4 GFLOP a product: beyond,
// the rate is flat and the nearest row stands); attention (head size,
// seq_len); the non-GEMM kernels over sizes from one sequence's [T, C] to a
// large micro-batch's MLP; and the links' largest message.
struct MeasuredShapes {
  std::set<std::tuple<int64_t, int64_t, int64_t>> matmuls;
  std::set<std::pair<int64_t, int64_t>> attention;
  std::vector<std::pair<double, const GptConfig*>> streams;  // elements, model
  double max_link_bytes = 64e6;
};
MeasuredShapes shapes_to_measure(const std::vector<GptConfig>& models,
                                 const std::vector<int64_t>& batches, int max_tp);

// The compute rows of `m` (matmul, attention, kernels, memory_bandwidth)
// through the op set's own ops.
inline int points(const MeasuredShapes& s) {
  return static_cast<int>(s.matmuls.size() + s.attention.size() + s.streams.size());
}

template <class Ops>
void measure_compute(const OpBench<Ops>& d, const MeasuredShapes& s, double seconds,
                     MachineSpec& m, Progress* progress = nullptr) {
  // Each shape measured is a point of the caller's phase (points(s)).
  auto point = [&] {
    if (progress != nullptr) progress->point();
  };
  for (const auto& [rows, k, n] : s.matmuls) {
    m.matmul.push_back(measure_matmul(d, rows, k, n, seconds));
    point();
  }
  for (const auto& [hs, T] : s.attention) {
    m.attention.push_back(measure_attention(d, hs, T, seconds));
    point();
  }
  for (const auto& [e, cfg] : s.streams) {
    m.kernels.push_back(measure_kernels(d, e, *cfg, seconds));
    point();
  }
  std::sort(m.kernels.begin(), m.kernels.end(),
            [](const KernelRow& a, const KernelRow& b) { return a.elements < b.elements; });
  m.memory_bandwidth = m.kernels.empty() ? 10e9 : m.kernels.back().bandwidth.at("residual");
}

}  // namespace mpiformer::calibration
