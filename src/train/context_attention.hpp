// The stage's context group (model/gpt_stage.hpp's ContextGroup) over an
// op set (host or CUDA): train/ring_attention.hpp's ring over the group's
// communicator, computing in the op set's Acc type (float, or double for
// the host's checks). A 16-bit stage's rows are widened into float
// buffers for the ring and its results rounded back, as each back end's
// own attention computes in float from 16-bit operands; its key/value
// blocks go round in 16 bits, taken from the stage's own rows. Every buffer is
// sized once here: a step allocates nothing.
#pragma once
#include <chrono>
#include <cstdint>
#include <type_traits>

#include "core/gpt_config.hpp"
#include "model/gpt_stage.hpp"
#include "train/ring_attention.hpp"
#include "train/tensor_group.hpp"

namespace mpiformer {

template <class Ops>
class ContextAttention {
 public:
  using Act = typename Ops::Act;
  using Acc = typename Ops::Acc;
  using Context = typename Ops::Context;

  // `ctx`: the stage's, and `ring`: the context group, both of which must
  // outlive this; the stage's widths under tensor parallelism `tp`;
  // `observer` (may be empty) told of each pass round the ring with the
  // bytes this rank sent.
  ContextAttention(Context& ctx, Communicator& ring, const GptConfig& cfg, int64_t tp,
                   int64_t micro_batch, ContextChunks order, const TensorOpObserver* observer)
      : ctx_(ctx),
        shape_{micro_batch, cfg.n_embd / tp, cfg.n_head / tp, cfg.kv_heads_per_rank(tp)},
        n_(cfg.seq_len / (2 * ring.size())),
        rows_(micro_batch * cfg.seq_len / ring.size()),
        qkv_width_(cfg.qkv_dim_per_rank(tp)),
        ring_(ctx, ring, shape_, n_, order),
        cp_(ring.size()),
        rank_(ring.rank()),
        order_(order),
        comm_(ring),
        observer_(observer) {
    if (qkv_width_ != shape_.C + 2 * shape_.K())
      throw std::logic_error("ContextAttention: the fused qkv rows are not [q | k | v]");
    // Each step's arithmetic as a span of its own: the work a rank's
    // chunks give it, apart from its waits on the ring (the balance).
    using Time = std::chrono::steady_clock::time_point;
    ring_.observe_blocks([this](Time t0, Time t1) {
      if (observer_ != nullptr && *observer_) (*observer_)(kContextBlock, t0, t1, 0);
    });
    starts_ = Buffer<int64_t>(static_cast<size_t>(rows_));
    if constexpr (!std::is_same_v<Act, Acc>) {
      qkv_ = Buffer<Acc>(static_cast<size_t>(rows_ * qkv_width_));
      dqkv_ = Buffer<Acc>(qkv_.size());
      out_ = Buffer<Acc>(static_cast<size_t>(rows_ * shape_.C));
      dout_ = Buffer<Acc>(out_.size());
    }
  }

  // What the ring and the widened copies hold (plan/rank_memory.hpp's
  // context_attention_bytes predicts it).
  double allocated_bytes() const {
    const size_t copies = qkv_.size() + dqkv_.size() + out_.size() + dout_.size();
    return ring_.allocated_bytes() + static_cast<double>(copies * sizeof(Acc)) +
           static_cast<double>(starts_.size() * sizeof(int64_t));
  }

  ContextGroup group() {
    ContextGroup g;
    g.forward = [this](const void* qkv, void* out, void* lse, const int32_t* positions) {
      forward(static_cast<const Act*>(qkv), static_cast<Act*>(out), static_cast<Acc*>(lse),
              document_starts(positions));
    };
    g.backward = [this](const void* qkv, const void* out, const void* lse, const void* dout,
                        void* dqkv, const int32_t* positions) {
      backward(static_cast<const Act*>(qkv), static_cast<const Act*>(out),
               static_cast<const Acc*>(lse), static_cast<const Act*>(dout), static_cast<Act*>(dqkv),
               document_starts(positions));
    };
    // A Mixture of Experts' router: its counts, exact in double, and its
    // probabilities' sums over the group (off the observer: a few
    // hundred bytes per layer).
    g.router.gather = [this](const double* mine, double* all, int64_t n) {
      comm_.allgather(mine, all, n, Element::kF64);
    };
    g.router.sum = [this](double* data, int64_t n) { comm_.allreduce_sum(data, n); };
    g.rank = rank_;
    g.order = order_;
    return g;
  }

 private:
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;

  // Under a document mask, each row's document's first position in the
  // sequence: its own position there (its chunk's place plus its row in
  // it, chunk-major) less its position in its document.
  const int64_t* document_starts(const int32_t* positions) {
    if (positions == nullptr) return nullptr;
    Ops::ring_document_starts(ctx_, starts_.get(), positions, shape_.B, n_, ring_.chunk_start(rank_, 0),
                              ring_.chunk_start(rank_, 1));
    return starts_.get();
  }

  void forward(const Act* qkv, Act* out, Acc* lse, const int64_t* starts) {
    timed(false, [&] {
      if constexpr (std::is_same_v<Act, Acc>) {
        ring_.forward(qkv, out, lse, starts);
      } else {
        Ops::widen(ctx_, qkv_.get(), qkv, rows_ * qkv_width_);
        ring_.forward(qkv_.get(), out_.get(), lse, starts, qkv);
        Ops::convert(ctx_, out, out_.get(), rows_ * shape_.C);
      }
    });
  }

  void backward(const Act* qkv, const Act* out, const Acc* lse, const Act* dout, Act* dqkv,
                const int64_t* starts) {
    timed(true, [&] {
      if constexpr (std::is_same_v<Act, Acc>) {
        ring_.backward(qkv, out, lse, dout, dqkv, starts);
      } else {
        Ops::widen(ctx_, qkv_.get(), qkv, rows_ * qkv_width_);
        Ops::widen(ctx_, out_.get(), out, rows_ * shape_.C);
        Ops::widen(ctx_, dout_.get(), dout, rows_ * shape_.C);
        ring_.backward(qkv_.get(), out_.get(), lse, dout_.get(), dqkv_.get(), starts, qkv);
        Ops::convert(ctx_, dqkv, dqkv_.get(), rows_ * qkv_width_);
      }
    });
  }

  // `run`, one pass round the ring, told to the observer with the bytes
  // this rank sent: its key/value block (in Act) passed on c - 1 times;
  // backward, each time with a block of their gradients' sums (in Acc),
  // and the sums home once more.
  template <class F>
  void timed(bool backward_pass, const F& run) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    if (observer_ == nullptr || !*observer_) return;
    const double block = static_cast<double>(rows_ * 2 * shape_.K());
    const double steps = static_cast<double>(cp_ - 1);
    const double sent = steps * block * sizeof(Act) +
                        (backward_pass ? (steps + 1) * block * sizeof(Acc) : 0.0);
    (*observer_)(kContextRing, t0, std::chrono::steady_clock::now(), sent);
  }

  Context& ctx_;
  AttentionShape shape_;
  int64_t n_, rows_, qkv_width_;
  RingAttention<Ops> ring_;
  int cp_, rank_;
  ContextChunks order_;
  Communicator& comm_;
  const TensorOpObserver* observer_;
  Buffer<int64_t> starts_;  // document_starts'
  Buffer<Acc> qkv_, dqkv_, out_, dout_;  // 16-bit stages only
};

}  // namespace mpiformer
