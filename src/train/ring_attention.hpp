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
// Host memory and the host's kernels (the CUDA kernels' turn comes with
// the trainer's [parallel] cp); the messages go through the group's
// Communicator.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "host/attention_blocks.hpp"
#include "parallel/communicator.hpp"

namespace mpiformer {

template <class T>
class RingAttention {
 public:
  using Clock = std::chrono::steady_clock;
  // Told of each step's arithmetic (the blocks' attention, not the waits
  // for the next block): when it ran.
  using BlockObserver = std::function<void(Clock::time_point, Clock::time_point)>;

  // `ring`: the context-parallel group, rank r holding chunks
  // context_chunks(r, size, order); `n`: tokens per chunk.
  // `tile`: the query rows a task takes at once (the tests' small tiles
  // cut a chunk into several, the last short).
  RingAttention(Communicator& ring, const host::AttentionShape& shape, int64_t n,
                ContextChunks order = ContextChunks::kHeadTail,
                int64_t tile = kRingQueryTile)
      : ring_(ring), a_(shape), n_(n), tile_(tile), order_(order) {
    const size_t kv = static_cast<size_t>(2 * a_.B * n_ * 2 * a_.K());
    for (auto& b : kv_) b.resize(kv);
    for (auto& b : dkv_) b.resize(kv);
    // The accumulators, sized once: a step allocates nothing.
    const size_t rows = static_cast<size_t>(2 * a_.B * a_.NH * n_);
    m_.resize(rows);
    l_.resize(rows);
    delta_.resize(rows);
    scratch_.resize(static_cast<size_t>(ring_scratch_elements(a_.B, a_.NKV, n_, n_, tile_)));
  }

  void observe_blocks(BlockObserver observer) { on_block_ = std::move(observer); }

  // Bytes of its buffers: two key/value blocks and two of their
  // gradients' sums, three accumulators per query row, and the tasks'
  // score tiles.
  double allocated_bytes() const {
    size_t n = m_.size() + l_.size() + delta_.size() + scratch_.size();
    for (const auto& b : kv_) n += b.size();
    for (const auto& b : dkv_) n += b.size();
    return static_cast<double>(n * sizeof(T));
  }

  // The global position of local chunk j's first token on rank `rank`.
  int64_t chunk_start(int rank, int j) const {
    const host::ContextChunkPair c = host::context_chunks(rank, ring_.size(), order_);
    return (j == 0 ? c.first : c.second) * n_;
  }

  // qkv [2, B, n, C + 2K] -> out [2, B, n, C], lse [2, B, NH, n] (kept
  // for backward). `starts` [2, B, n] under a document mask: each query's
  // document's first position in the sequence (nullptr: none).
  void forward(const T* qkv, T* out, T* lse, const int64_t* starts = nullptr) {
    const int64_t rows = a_.B * a_.NH * n_;
    T* m = m_.data();
    T* l = l_.data();
    for (int j = 0; j < 2; ++j)
      host::ring_attention_start(a_, n_, m + j * rows, l + j * rows, out + j * out_block());
    take_kv(qkv, kv_[0].data());
    circulate(kv_, nullptr, kForwardTag, [&](int owner, const T* kv, T*) {
      for (int qa = 0; qa < 2; ++qa)
        for (int kb = 0; kb < 2; ++kb)
          host::ring_attention_forward(a_, qkv + qa * qkv_block(), chunk_start(ring_.rank(), qa), n_,
                                       kv + kb * kv_block(), chunk_start(owner, kb), n_, m + qa * rows,
                                       l + qa * rows, out + qa * out_block(), scratch_.data(),
                                       chunk_starts(starts, qa), tile_);
    });
    for (int j = 0; j < 2; ++j)
      host::ring_attention_finish(a_, n_, out + j * out_block(), m + j * rows, l + j * rows,
                                  lse + j * rows);
  }

  // dqkv [2, B, n, C + 2K] is overwritten: the queries' gradients from
  // every block, the keys' and values' summed over every rank's queries.
  void backward(const T* qkv, const T* out, const T* lse, const T* dout, T* dqkv,
                const int64_t* starts = nullptr) {
    const int64_t rows = a_.B * a_.NH * n_, ld = a_.C + 2 * a_.K();
    T* delta = delta_.data();
    for (int j = 0; j < 2; ++j)
      host::ring_attention_delta(a_, n_, out + j * out_block(), dout + j * out_block(), delta + j * rows);
    std::fill(dqkv, dqkv + 2 * qkv_block(), T(0));
    take_kv(qkv, kv_[0].data());
    std::fill(dkv_[0].begin(), dkv_[0].end(), T(0));
    circulate(kv_, &dkv_, kBackwardTag, [&](int owner, const T* kv, T* dkv) {
      for (int qa = 0; qa < 2; ++qa)
        for (int kb = 0; kb < 2; ++kb)
          host::ring_attention_backward(a_, qkv + qa * qkv_block(), chunk_start(ring_.rank(), qa), n_,
                                        kv + kb * kv_block(), chunk_start(owner, kb), n_, dout + qa * out_block(),
                                        lse + qa * rows, delta + qa * rows, dqkv + qa * qkv_block(),
                                        dkv + kb * kv_block(), scratch_.data(), chunk_starts(starts, qa),
                                        tile_);
    });
    // The block now held is the next rank's, its sums complete: home to
    // it; this rank's own comes from the previous.
    const int c = ring_.size(), r = ring_.rank();
    const T* mine = dkv_[cur_].data();
    if (c > 1) {
      ring_.start_exchange_bytes(dkv_[cur_].data(), dkv_[1 - cur_].data(), bytes(), (r + 1) % c,
                                 (r + c - 1) % c, kHomeTag)
          ->wait();
      mine = dkv_[1 - cur_].data();
    }
    const int64_t K2 = 2 * a_.K();
    for (int64_t row = 0; row < 2 * a_.B * n_; ++row)
      std::copy_n(mine + row * K2, K2, dqkv + row * ld + a_.C);
  }

 private:
  static constexpr int kForwardTag = 4900, kBackwardTag = 4910, kHomeTag = 4920;
  int64_t qkv_block() const { return a_.B * n_ * (a_.C + 2 * a_.K()); }
  int64_t kv_block() const { return a_.B * n_ * 2 * a_.K(); }
  int64_t out_block() const { return a_.B * n_ * a_.C; }
  const int64_t* chunk_starts(const int64_t* starts, int j) const {
    return starts != nullptr ? starts + j * a_.B * n_ : nullptr;
  }
  size_t bytes() const { return sizeof(T) * kv_[0].size(); }

  // This rank's keys and values, [2, B, n, 2K], from its fused rows.
  void take_kv(const T* qkv, T* kv) const {
    const int64_t ld = a_.C + 2 * a_.K(), K2 = 2 * a_.K();
    for (int64_t row = 0; row < 2 * a_.B * n_; ++row) std::copy_n(qkv + row * ld + a_.C, K2, kv + row * K2);
  }

  // c steps: `work(owner, kv, dkv)` on the blocks held, each passed on to
  // the next rank as the previous rank's arrives (with its gradients'
  // sums when `dkv` is given). The block goes on while the work runs (its
  // bytes do not change, and the one arriving lands in the other
  // buffer); the sums only after it (the work adds to them).
  template <class F>
  void circulate(std::vector<T> (&kv)[2], std::vector<T> (*dkv)[2], int tag, const F& work) {
    const int c = ring_.size(), r = ring_.rank(), next = (r + 1) % c, prev = (r + c - 1) % c;
    cur_ = 0;
    for (int s = 0; s < c; ++s) {
      const int owner = (r - s + c) % c;
      Pending moved;
      if (s + 1 < c)
        moved = ring_.start_exchange_bytes(kv[cur_].data(), kv[1 - cur_].data(), bytes(), next, prev,
                                           tag + 2 * (s % 2));
      const Clock::time_point t0 = Clock::now();
      work(owner, kv[cur_].data(), dkv != nullptr ? (*dkv)[cur_].data() : nullptr);
      if (on_block_) on_block_(t0, Clock::now());
      if (s + 1 == c) break;
      if (dkv != nullptr)
        ring_.start_exchange_bytes((*dkv)[cur_].data(), (*dkv)[1 - cur_].data(), bytes(), next, prev,
                                   tag + 1 + 2 * (s % 2))
            ->wait();
      moved->wait();
      cur_ = 1 - cur_;
    }
  }

  Communicator& ring_;
  host::AttentionShape a_;
  int64_t n_, tile_;
  ContextChunks order_;
  BlockObserver on_block_;
  std::vector<T> kv_[2], dkv_[2];  // the block held and the one arriving
  std::vector<T> scratch_;         // ring_scratch_elements: each task's score tiles
  std::vector<T> m_, l_, delta_;   // per query row of both chunks: the running max and sum; delta
  int cur_ = 0;
};

}  // namespace mpiformer
