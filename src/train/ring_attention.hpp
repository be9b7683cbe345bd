// Attention across a context-parallel group (issue 49): each of the
// group's c ranks holds 2 of the sequence's 2c chunks of n tokens (by
// default chunk r and chunk 2c - 1 - r, head-tail: every rank's queries
// see as many keys; common/context_chunks.hpp), laid out chunk-major as
// [2, B, n, ...] (each chunk a contiguous micro-batch of B sequences of n
// rows: the rest of the model treats the rank's rows as 2B short
// sequences). The key/value blocks go round the ring: at step s rank r
// holds rank (r - s) mod c's and, while it attends to them, sends them on
// to rank r + 1. Backward sends the blocks round again with their
// gradients' partial sums, which after c steps are complete and go back to
// their owner. Pairs whose keys all follow their queries are skipped.
//
// The ring's order is the same for any layout of the other axes; the
// softmax is summed across blocks in that order, so cp changes the result
// by rounding only (another order of the same sums), not by its content.
// Written once over an op set (host/ops.hpp, cuda/ops.hpp), which
// supplies the blocks' arithmetic, the copies and the buffers; the
// messages go through the group's Communicator, each step one exchange
// (on a GPU, stream-ordered: nothing here waits on the host for them).
// The ring computes in Acc; its key/value blocks travel in the stage's Act
// (a 16-bit stage's values exactly, half float's bytes), their gradients'
// sums in Acc (sums of many ranks' parts).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "common/attention_shape.hpp"
#include "common/attention_storage.hpp"
#include "common/context_chunks.hpp"
#include "parallel/communicator.hpp"

namespace mpiformer {

template <class Ops>
class RingAttention {
 public:
  using T = typename Ops::Acc;   // what the ring computes in, and sends the sums in
  using KV = typename Ops::Act;  // what the key/value blocks travel in
  using Context = typename Ops::Context;
  using Clock = std::chrono::steady_clock;
  // Told of each step's arithmetic (the blocks' attention, not the waits
  // for the next block): when it ran. (On a GPU, when it was queued.)
  using BlockObserver = std::function<void(Clock::time_point, Clock::time_point)>;

  // `ring`: the context-parallel group, rank r holding chunks
  // context_chunks(r, size, order); `n`: tokens per chunk.
  // `tile`: the query rows a host task takes at once (the tests' small
  // tiles cut a chunk into several, the last short).
  RingAttention(Context& ctx, Communicator& ring, const AttentionShape& shape, int64_t n,
                ContextChunks order = ContextChunks::kHeadTail, int64_t tile = kRingQueryTile)
      : ctx_(ctx), ring_(ring), a_(shape), n_(n), tile_(tile), order_(order) {
    // Every buffer sized once: a step allocates nothing.
    const size_t kv = static_cast<size_t>(2 * a_.B * n_ * 2 * a_.K());
    for (auto& b : kv_) b = KvBuffer(kv);
    for (auto& b : dkv_) b = Buffer(kv);
    const size_t rows = static_cast<size_t>(2 * a_.B * a_.NH * n_);
    m_ = Buffer(rows);
    l_ = Buffer(rows);
    delta_ = Buffer(rows);
    scratch_ = Buffer(static_cast<size_t>(Ops::ring_scratch_elements(a_, n_, tile_)));
  }

  void observe_blocks(BlockObserver observer) { on_block_ = std::move(observer); }

  // Bytes of its buffers: two key/value blocks and two of their
  // gradients' sums, three accumulators per query row, and (on the host)
  // the tasks' score tiles.
  double allocated_bytes() const {
    size_t n = m_.size() + l_.size() + delta_.size() + scratch_.size();
    for (const auto& b : dkv_) n += b.size();
    return static_cast<double>(n * sizeof(T)) + 2.0 * static_cast<double>(kv_bytes());
  }

  // The global position of local chunk j's first token on rank `rank`.
  int64_t chunk_start(int rank, int j) const {
    const ContextChunkPair c = context_chunks(rank, ring_.size(), order_);
    return (j == 0 ? c.first : c.second) * n_;
  }

  // qkv [2, B, n, C + 2K] -> out [2, B, n, C], lse [2, B, NH, n] (kept
  // for backward). `starts` [2, B, n] under a document mask: each query's
  // document's first position in the sequence (nullptr: none), where the
  // op set's kernels read it. `rows`: the same rows in KV, where the keys
  // and values are taken from (needed where KV is not T).
  void forward(const T* qkv, T* out, T* lse, const int64_t* starts = nullptr,
               const KV* rows = nullptr) {
    const int64_t n_rows = a_.B * a_.NH * n_;
    T* m = m_.get();
    T* l = l_.get();
    for (int j = 0; j < 2; ++j)
      Ops::ring_start(ctx_, a_, n_, m + j * n_rows, l + j * n_rows, out + j * out_block());
    take_kv(qkv, rows);
    circulate(kForwardTag, false, [&](int owner, const KV* kv, T*) {
      for (int qa = 0; qa < 2; ++qa)
        for (int kb = 0; kb < 2; ++kb)
          Ops::ring_forward(ctx_, a_, qkv + qa * qkv_block(), chunk_start(ring_.rank(), qa), n_,
                            kv + kb * kv_block(), chunk_start(owner, kb), n_, m + qa * n_rows,
                            l + qa * n_rows, out + qa * out_block(), scratch_.get(),
                            chunk_starts(starts, qa), tile_, n_);
    });
    for (int j = 0; j < 2; ++j)
      Ops::ring_finish(ctx_, a_, n_, out + j * out_block(), m + j * n_rows, l + j * n_rows,
                       lse + j * n_rows);
  }

  // dqkv [2, B, n, C + 2K] is overwritten: the queries' gradients from
  // every block, the keys' and values' summed over every rank's queries.
  void backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv,
                const int64_t* starts = nullptr, const KV* rows = nullptr) {
    const int64_t n_rows = a_.B * a_.NH * n_, ld = a_.C + 2 * a_.K();
    T* delta = delta_.get();
    for (int j = 0; j < 2; ++j)
      Ops::ring_delta(ctx_, a_, n_, out + j * out_block(), dout + j * out_block(), delta + j * n_rows);
    Ops::fill_zero(ctx_, dqkv, 2 * qkv_block());
    take_kv(qkv, rows);
    Ops::fill_zero(ctx_, dkv_[0].get(), static_cast<int64_t>(dkv_[0].size()));
    circulate(kBackwardTag, true, [&](int owner, const KV* kv, T* dkv) {
      for (int qa = 0; qa < 2; ++qa)
        for (int kb = 0; kb < 2; ++kb)
          Ops::ring_backward(ctx_, a_, qkv + qa * qkv_block(), chunk_start(ring_.rank(), qa), n_,
                             kv + kb * kv_block(), chunk_start(owner, kb), n_, dout + qa * out_block(),
                             lse + qa * n_rows, delta + qa * n_rows, dqkv + qa * qkv_block(),
                             dkv + kb * kv_block(), scratch_.get(), chunk_starts(starts, qa), tile_, n_);
    });
    // The block now held is the next rank's, its sums complete: home to
    // it; this rank's own comes from the previous.
    const int c = ring_.size(), r = ring_.rank();
    const T* mine = dkv_[cur_].get();
    if (c > 1) {
      ring_.start_exchange_bytes(dkv_[cur_].get(), dkv_[1 - cur_].get(), dkv_bytes(), (r + 1) % c,
                                 (r + c - 1) % c, kHomeTag)
          ->wait();
      mine = dkv_[1 - cur_].get();
    }
    Ops::copy_rows(ctx_, dqkv + a_.C, ld, mine, 2 * a_.K(), 2 * a_.B * n_, 2 * a_.K());
  }

 private:
  using Buffer = typename Ops::template Buffer<T>;
  using KvBuffer = typename Ops::template Buffer<KV>;
  static constexpr int kForwardTag = 4900, kBackwardTag = 4910, kHomeTag = 4920;
  int64_t qkv_block() const { return a_.B * n_ * (a_.C + 2 * a_.K()); }
  int64_t kv_block() const { return a_.B * n_ * 2 * a_.K(); }
  int64_t out_block() const { return a_.B * n_ * a_.C; }
  const int64_t* chunk_starts(const int64_t* starts, int j) const {
    return starts != nullptr ? starts + j * a_.B * n_ : nullptr;
  }
  size_t kv_bytes() const { return sizeof(KV) * kv_[0].size(); }
  size_t dkv_bytes() const { return sizeof(T) * dkv_[0].size(); }

  // This rank's keys and values, [2, B, n, 2K], into the block held first,
  // from its fused rows (in KV: `rows`, or where KV is T `qkv` itself).
  void take_kv(const T* qkv, const KV* rows) {
    if constexpr (std::is_same_v<KV, T>) {
      if (rows == nullptr) rows = qkv;
    }
    if (rows == nullptr) throw std::logic_error("RingAttention: a 16-bit stage's rows not given");
    Ops::copy_rows(ctx_, kv_[0].get(), 2 * a_.K(), rows + a_.C, a_.C + 2 * a_.K(), 2 * a_.B * n_,
                   2 * a_.K());
  }

  // c steps: `work(owner, kv, dkv)` on the blocks held, each passed on to
  // the next rank as the previous rank's arrives (with its gradients'
  // sums when `sums`). The block goes on while the work runs (its bytes do
  // not change, and the one arriving lands in the other buffer); the sums
  // only after it (the work adds to them).
  template <class F>
  void circulate(int tag, bool sums, const F& work) {
    const int c = ring_.size(), r = ring_.rank(), next = (r + 1) % c, prev = (r + c - 1) % c;
    cur_ = 0;
    for (int s = 0; s < c; ++s) {
      const int owner = (r - s + c) % c;
      Pending moved;
      if (s + 1 < c)
        moved = ring_.start_exchange_bytes(kv_[cur_].get(), kv_[1 - cur_].get(), kv_bytes(), next,
                                           prev, tag + 2 * (s % 2));
      const Clock::time_point t0 = Clock::now();
      work(owner, kv_[cur_].get(), sums ? dkv_[cur_].get() : nullptr);
      if (on_block_) on_block_(t0, Clock::now());
      if (s + 1 == c) break;
      if (sums)
        ring_.start_exchange_bytes(dkv_[cur_].get(), dkv_[1 - cur_].get(), dkv_bytes(), next, prev,
                                   tag + 1 + 2 * (s % 2))
            ->wait();
      moved->wait();
      cur_ = 1 - cur_;
    }
  }

  Context& ctx_;
  Communicator& ring_;
  AttentionShape a_;
  int64_t n_, tile_;
  ContextChunks order_;
  BlockObserver on_block_;
  KvBuffer kv_[2];         // the block held and the one arriving
  Buffer dkv_[2];          // ... and their gradients' sums
  Buffer scratch_;         // the op set's ring_scratch_elements
  Buffer m_, l_, delta_;   // per query row of both chunks: the running max and sum; delta
  int cur_ = 0;
};

}  // namespace mpiformer
