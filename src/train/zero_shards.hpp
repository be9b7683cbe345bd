// ZeRO stages 1-3 for one pipeline stage, over its data-parallel group, on
// any device (the stage's op set and the group's communicator do the work).
// The rank owns its part of every unit (model/shard_plan.hpp) and keeps,
// for its shard only: the Acc master weights and both AdamW moments, and
// at zero 2-3 the reduced gradients (at zero 3 in mixed precision also the
// Act copy it gathers from). Where the stage holds a whole buffer, the
// shard's share of it is the owned rows of that buffer, not a copy
// (Megatron's distributed optimizer keeps 6 + 12/dp bytes a parameter in
// bf16 this way; so does zero 1 here):
//   - the masters in fp32 at zero 1-2: the stage's weights (precision
//     plan, "the weights are the masters");
//   - the reduced gradients at zero 1: reduce-scattered in place into the
//     stage's whole gradients, each rank's sum landing on its own rows;
//   - the Act copy at zero 1-2: AdamW rounds into the owned rows of the
//     stage's whole weights, and the all-gather publishes them in place.
// Offloaded in mixed precision, the masters and moments are held by
// adamw_state.hpp, outside the back end's memory.
//   zero 1: the stage keeps whole gradients, accumulated locally over the
//     micro-batches; at the last one each unit is reduce-scattered to its
//     owners as soon as backward has finished it (the overlap zero 0's
//     all-reduce has). After AdamW on the shard, every unit's weights are
//     all-gathered.
//   zero 2: the blocks' gradients live in two windows: each block's is
//     reduce-scattered after its backward in every micro-batch and added
//     to the shard, so the whole gradient never exists (bytes moved: the
//     blocks' gradients once per micro-batch instead of once per step; the
//     memory: two blocks instead of all). The vocabulary's gradients go
//     through the same windows (StageLayout::windows_vocab), piece by
//     piece where larger than one, reduce-scattered after each use as a
//     block's (the tied copies' sum is of the reduced parts, at the end).
//     The other tensors outside the blocks (positions, final norm) stay
//     whole and go as in zero 1.
//   zero 3: the blocks' weights too live in two windows: each block's is
//     all-gathered before its forward and again before its backward, the
//     next block's gather started before this block computes. A window
//     that still holds the block asked for is not gathered again (the
//     last blocks of a forward are the first of the next backward).
//     The vocabulary's tensors (wte, an untied head) go through the same
//     windows (StageLayout::windows_vocab), as FSDP shards them: gathered
//     before the embedding and the head, their gradients reduce-scattered
//     after each use in every micro-batch, so zero 3 keeps nothing of them
//     whole. One larger than a window (V > about 12 C for GPT: Llama 3's
//     128K vocabulary) goes in row pieces of at most a window
//     (StageLayout::piece), one after another, the next gathered while
//     one computes: each piece's collective moves what each rank owns of
//     it (ShardPlan::for_window), so the shard and the checkpoints keep
//     their units.
// Under expert parallelism a sparse block's experts are a unit of their
// own, reduce-scattered and gathered over the replicas holding the same
// experts (the plan's expert units); at zero 2-3 a block's window then
// takes two collectives, one per group.
// The tied embedding's two copies (first and last stage, pp > 1) are cut
// alike, so their owned parts are summed across the pair after the
// reduce-scatter: the same sums, in the same order, as zero 0.
// Offloaded at zero 2-3 on a GPU ([train] offload "host" or "nvme"), the
// shard's reduced gradients leave the device too, as ZeRO-Offload's do:
// they accumulate in page-locked host memory, where the host's AdamW reads
// them. Each block's reduce-scattered parts come down on the offload
// copies' down stream (ordered after the reduce-scatter, not the host)
// into one of two staging buffers, and the host adds them into the shard
// when the window comes round again (the first micro-batch of a step
// copies instead: no pass to zero the shard). The units outside the
// blocks are reduce-scattered into a device buffer of their parts only,
// the tied pair summed there, and come down once a step. The device keeps
// those parts and the two block receive buffers instead of the shard:
// at bf16 zero 3 the shard's gradients were most of what remained. On the
// host back end the shard is host memory already; nothing changes.
// 16-bit gradients ([train] grad_dtype = bf16, mixed precision): the stage
// computes each block's micro-batch gradients into a float window (as at
// zero 2) and they leave it in the activation type:
//   zero 1: added into the blocks' 16-bit sums over the step (2 bytes a
//     parameter where zero 1 kept 4), the vocabulary's too (it goes
//     through the windows, piece by piece: StageLayout::sums_offset), and
//     at the last micro-batch each block's (piece's) sums are
//     reduce-scattered in 16 bits, in place, as soon as they are final (a
//     tied wte on a stage with both ends after the embedding's backward;
//     the tied copies' parts summed in 16 bits): the owned rows of the
//     sums are the shard's reduced gradients, which AdamW reads in 16
//     bits and widens (Megatron's
//     bf16 gradient buffer: 4 + 12/dp bytes a parameter with the 16-bit
//     weights). Offloaded, the streamed update reads float: the reduced
//     parts are added into a float shard instead, as at zero 2-3;
//   zero 2-3: rounded, and reduce-scattered in 16 bits after each block's
//     backward in every micro-batch, the reduced parts added into the
//     shard's float gradients (4 / dp bytes a parameter).
// The masters and moments see float as before. The small units outside
// the blocks (wpe, the final norm) keep float gradients and float
// reductions; the vocabulary goes through the windows as a block does.
// An offloaded shard's gradients stay on the device with 16-bit
// gradients.
#pragma once
#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/gpt_stage.hpp"
#include "model/shard_plan.hpp"
#include "parallel/communicator.hpp"
#include "train/stage_optimizer.hpp"

namespace mpiformer {

template <class Ops>
class ZeroShards final : public StageOptimizer<Ops> {
 public:
  using Act = typename Ops::Act;
  using Acc = typename Ops::Acc;
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;
  template <class U>
  using HostBuffer = typename Ops::template HostBuffer<U>;

  // `offload`: where the shard's moments live (adamw_state.hpp).
  // `grad_dtype`: bf16 keeps the blocks' gradients in Act (the header).
  ZeroShards(GptStage<Ops>& stage, int zero, int dp, int dp_rank, const OffloadSetup& offload,
             GradDtype grad_dtype = GradDtype::kFp32)
      : stage_(stage),
        ctx_(stage.context()),
        zero_(zero),
        plan_(stage.table(), stage.layout(), dp, dp_rank, static_cast<int>(stage.range().ep)),
        n_(plan_.shard_size()),
        alias_(masters_are_weights(zero)),
        grad16_(grad_dtype == GradDtype::kBf16),
        gwin_(zero >= 2 || grad16_),
        in_stage_(in_stage(zero, grad16_, offload.where, stage.vocab_grads_windowed())),
        grads_on_host_(gradients_offloaded(zero, offload.where) && !grad16_),
        vocab_(stage.vocab_grads_windowed()),
        moments_(stage.context(), n_, plan_.adamw_chunks(stage.table(), in_stage_), offload) {
    if (grad16_ && Ops::kActElement != Element::kBf16)
      throw std::logic_error("ZeRO's shards: 16-bit gradients without a bf16 stage");
    // Counted as allocated, as the stage counts its own: the accounting
    // (rank_memory) must predict the sum (test_memory_accounting.cpp).
    auto acc = [&](int64_t count) {
      allocated_ += static_cast<double>(count) * sizeof(Acc);
      Buffer<Acc> b(static_cast<size_t>(count));
      Ops::fill_zero(ctx_, b.get(), count);
      return b;
    };
    if (!alias_ && !moments_.holds_masters()) master_ = acc(n_);
    if (moments_.where() == Offload::kNone) allocated_ += 2.0 * static_cast<double>(n_) * sizeof(Acc);
    if (grads_on_host_) {
      host_grads_ = HostBuffer<Acc>(static_cast<size_t>(n_));
      for (auto& h : recv_host_) h = HostBuffer<Acc>(static_cast<size_t>(plan_.max_block_part()));
      fresh_.assign(static_cast<size_t>(plan_.units().size()), 1);
      // The units outside the blocks: their parts, one after another (the
      // windowed vocabulary's too: its sums are added there, on the device).
      resident_at_.assign(plan_.units().size(), -1);
      int64_t at = 0;
      for (size_t k = 0; k < plan_.units().size(); ++k) {
        if (plan_.units()[k].block >= 0) continue;
        resident_at_[k] = at;
        at += plan_.part_size(plan_.units()[k]);
      }
      resident_ = acc(at);
      moments_.enable_host_gradients();
    } else if (!in_stage_.grads) {
      g_ = acc(n_);
    }
    if constexpr (!std::is_same_v<Act, Acc>) {
      if (!in_stage_.copy) {
        // Zeroed: held masters (offloaded) write the chunks' runs only,
        // and the padding between them (wte's padded rows) is gathered
        // into the weights the head multiplies with, where uninitialised
        // device memory made NaN gradients (seen under the emulation).
        wshard_ = Buffer<Act>(static_cast<size_t>(n_));
        Ops::fill_zero(ctx_, wshard_.get(), n_);
        allocated_ += static_cast<double>(n_) * sizeof(Act);
      }
    }
    auto act = [&](int64_t count) {
      allocated_ += static_cast<double>(count) * sizeof(Act);
      Buffer<Act> b(static_cast<size_t>(count));
      Ops::fill_zero(ctx_, b.get(), count);
      return b;
    };
    if (grad16_) {
      if (!in_stage_.grads16)
        for (auto& r : recv16_) r = act(plan_.max_window_part(vocab_));
      if (zero_ == 1) g16_ = act(stage.layout().sums_size(vocab_));
      else
        for (auto& b : send16_) b = act(stage.block_storage());
    } else if (zero_ >= 2) {
      for (auto& r : recv_) r = acc(plan_.max_window_part(vocab_));
    }
    const ParameterSpec* wte = stage.table().tied_embedding();
    if (wte != nullptr) wte_unit_ = &plan_.unit_at(wte->offset);
    next_unit_ = plan_.units().size();
    BlockHooks hooks;
    hooks.need_weights = [this](int64_t i, int64_t next) { need_weights(i, next); };
    hooks.need_published = [this](int64_t use) { need_published(use); };
    hooks.need_grad_window = [this](int64_t, int w) { drain(w); };
    hooks.grads_ready = [this](int64_t i, int w) { block_ready(i, w); };
    stage.set_hooks(std::move(hooks));
  }

  ~ZeroShards() override {
    // The window downloads write page-locked buffers freed here: waited
    // for, unless unwinding (a stream may be stuck behind a failed peer).
    if constexpr (!Ops::kHostMemory) {
      if (grads_on_host_ && std::uncaught_exceptions() == 0)
        for (int w = 0; w < 2; ++w) Ops::offload_copies(ctx_).wait_downloaded(w);
    }
  }
  ZeroShards(const ZeroShards&) = delete;
  ZeroShards& operator=(const ZeroShards&) = delete;

  // Whether the shard's gradients live in host memory (header).
  static constexpr bool gradients_offloaded(int zero, Offload where) {
    return !Ops::kHostMemory && std::is_same_v<Acc, float> && zero >= 2 && where != Offload::kNone;
  }

  // fp32 at zero 1-2: the masters are the stage's whole weights (every
  // unit resident there); zero 3 windows the blocks, mixed precision keeps
  // float masters beside 16-bit weights.
  static constexpr bool masters_are_weights(int zero) {
    return std::is_same_v<Act, Acc> && zero < 3;
  }
  // Which of the update's arrays are the owned rows of the stage's whole
  // buffers (the header's list): whole gradients exist at zero 1 only
  // (with 16-bit ones the blocks' sums, not offloaded), whole weights at
  // zero 1-2.
  static constexpr ShardInStage in_stage(int zero, bool grad16 = false,
                                         Offload where = Offload::kNone, bool vocab = false) {
    ShardInStage w;
    w.params = masters_are_weights(zero);
    w.grads16 = zero == 1 && grad16 && where == Offload::kNone;
    w.vocab16 = w.grads16 && vocab;
    w.grads = zero == 1 && (!grad16 || w.grads16);
    w.copy = !std::is_same_v<Act, Acc> && zero < 3;
    return w;
  }
  const ShardPlan& plan() const { return plan_; }
  const ShardPlan* shard_plan() const override { return &plan_; }
  int64_t state_size() const override { return plan_.shard_size(); }
  int zero() const override { return zero_; }
  // Bytes of the shard's buffers (its small chunk list aside).
  double allocated_bytes() const { return allocated_; }

  // The group, and under expert parallelism the replicas holding this
  // rank's experts; the weights are published at once if they are pending.
  void connect(Communicator& dp, Communicator* experts) override {
    if (plan_.ep() > 1 && experts == nullptr)
      throw std::logic_error("ZeRO's shards: expert parallelism without the experts' group");
    dp_ = &dp;
    experts_ = experts != nullptr ? experts : &dp;
    if (stale_) publish();
  }

  // The shard's state from host memory (n elements each, shard order);
  // null moments start at zero. The weights follow once published.
  void load(const float* master, const float* m, const float* v) override {
    settle();
    // Aliased masters exist in fp32 only (masters_are_weights): compiled
    // there only, so no mixed-precision instance sees a null destination.
    bool aliased = false;
    if constexpr (std::is_same_v<Act, Acc>) {
      if (alias_) {
        for (const ShardUnit& u : plan_.units())
          Ops::upload(ctx_, weights_as_masters(plan_.part_begin(u)), master + u.shard_offset,
                      plan_.part_size(u));
        aliased = true;
      }
    }
    if (moments_.holds_masters()) {
      moments_.load(master, m, v);
    } else {
      if (!aliased) Ops::upload(ctx_, master_.get(), master, n_);
      moments_.load(nullptr, m, v);
    }
    loaded();
  }
  // Initialisation part by part (no shard-sized temporary): the owned
  // rows of `spec` (part `p`) from host memory, then loaded().
  void upload_master(const ParameterSpec& spec, const TensorPart& p, const float* src) {
    const int64_t n = (p.row_end - p.row_begin) * spec.row_length();
    if (moments_.holds_masters()) {
      moments_.write_range(AdamWState<Ops>::kMaster, p.shard_offset, n, src);
      return;
    }
    Acc* dst = alias_ ? weights_as_masters(spec.offset + p.row_begin * spec.row_length())
                      : master_.get() + p.shard_offset;
    Ops::upload(ctx_, dst, src, n);
  }
  void loaded() {
    refresh_wshard();
    stale_ = true;
    if (dp_ != nullptr) publish();
  }
  // The masters: the shard (in shard order), or with masters_are_weights
  // the stage's whole weights (in table order), whose other ranks' parts
  // the gathers after AdamW may still be writing: waited for first (a save
  // reads them all, before the next forward would wait for them).
  Acc* master() override {
    if (moments_.holds_masters()) return moments_.master();
    if (!alias_) return master_.get();
    settle();
    return weights_as_masters(0);
  }
  bool masters_are_weights() const override { return alias_; }
  Acc* adam_m() override { return moments_.moment(0); }
  Acc* adam_v() override { return moments_.moment(1); }
  AdamWState<Ops>& moments() override { return moments_; }

  // Every rank draws each tensor whole (the same values everywhere), one
  // at a time, and keeps its rows (the shard's other elements, padding,
  // stay zero); the weights are gathered once the group exists.
  void init(uint64_t seed) override {
    std::vector<float> tensor;
    for (const auto& spec : stage_.table().specs()) {
      tensor.resize(static_cast<size_t>(spec.storage));
      fill_initial_tensor(spec, seed, tensor.data());
      const TensorPart p = plan_.part_of(spec);
      upload_master(spec, p, tensor.data() + p.row_begin * spec.row_length());
    }
    loaded();
  }

  // A step begins: no unit's reduction started yet (an interleaved stage
  // finishes its units over several backwards, one per chunk).
  void zero_grads() override {
    stage_.zero_grads();
    held_ = 0;  // an evaluation's waits between steps are not the step's
    if (grads_on_host_) {
      std::fill(fresh_.begin(), fresh_.end(), 1);
      // The windowed vocabulary's sums accumulate in its resident parts.
      if (vocab_) Ops::fill_zero(ctx_, resident_.get(), static_cast<int64_t>(resident_.size()));
    } else if (!in_stage_.grads) Ops::fill_zero(ctx_, g_.get(), n_);
    if (g16_.size() > 0) Ops::fill_zero(ctx_, g16_.get(), static_cast<int64_t>(g16_.size()));
    next_unit_ = plan_.units().size();
  }

  // One micro-batch's backward (of one chunk); `last`: the step's last
  // micro-batch. Under split backward the stage calls the hook from W
  // (weight_gradients) only.
  void backward(int slot, bool last, int chunk) override {
    last_ = last;
    stage_.backward(slot, grads_final(last), chunk);
  }
  void weight_gradients(int slot, bool last, int chunk) override {
    last_ = last;
    stage_.weight_gradients(slot, grads_final(last), chunk);
  }

  // Waits for every reduce-scatter; sums the tied embedding's copies.
  // Returns the seconds spent waiting, here and earlier in the step
  // (held(): the forward's and backward's waits for the group).
  double finish(Communicator* tied) override {
    const double earlier = std::exchange(held_, 0.0);
    const auto t0 = std::chrono::steady_clock::now();
    drain(0);
    drain(1);
    for (auto& p : pending_) p->wait();
    pending_.clear();
    held_ = 0;  // the drains just now: in this wait already
    next_unit_ = plan_.units().size();  // the next step starts from the end again
    if (tied != nullptr && wte_unit_ != nullptr) {
      if (narrow(*wte_unit_))
        tied->allreduce(sums_of(plan_.part_begin(*wte_unit_)), plan_.part_size(*wte_unit_),
                        Ops::kActElement, Reduction::kSum);
      else
        tied->allreduce_sum(reduced_into(*wte_unit_), plan_.part_size(*wte_unit_));
    }
    if (grads_on_host_) {
      // The units outside the blocks, summed: down into the shard.
      for (size_t k = 0; k < plan_.units().size(); ++k)
        if (resident_at_[k] >= 0)
          Ops::download(ctx_, host_grads_.get() + plan_.units()[k].shard_offset,
                        resident_.get() + resident_at_[k], plan_.part_size(plan_.units()[k]));
    }
    return earlier + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // The shared kv rows of the owned parts: every tensor rank of a sharing
  // group cuts its slice alike, so they own the same rows.
  int64_t sum_shared_rows(Communicator& kv) override {
    int64_t n = 0;
    for (const auto& spec : stage_.table().specs()) {
      const TensorPart p = plan_.part_of(spec);
      const ParameterSpec::Rows r = spec.shared_rows_in(p.row_begin, p.row_end);
      const int64_t len = (r.end - r.begin) * spec.row_length();
      if (len == 0) continue;
      if (narrow(spec)) {
        kv.allreduce(sums_of(spec.offset + r.begin * spec.row_length()), len, Ops::kActElement,
                     Reduction::kSum);
        n += len;
        continue;
      }
      Acc* rows = grads_of(spec, p) + (r.begin - p.row_begin) * spec.row_length();
      if (grads_on_host_) {
        // Host memory: up into a receive buffer (free after finish), summed
        // there, down again; a block's rows fit one.
        for (int64_t at = 0; at < len; at += plan_.max_block_part()) {
          const int64_t m = std::min(len - at, plan_.max_block_part());
          Ops::upload(ctx_, recv_[0].get(), rows + at, m);
          kv.allreduce_sum(recv_[0].get(), m);
          Ops::download(ctx_, rows + at, recv_[0].get(), m);
        }
      } else {
        kv.allreduce_sum(rows, len);
      }
      n += len;
    }
    return n;
  }

  // The owned gradients' sum of squares (without the tied wte's: its other
  // copy counts it; without the tensors replicated over a tensor group:
  // its rank 0 counts them; without the shared kv rows: their first
  // sharer counts them).
  void make_gradient_nonfinite() override {
    if constexpr (Ops::kHostMemory) {
      for (const ShardUnit& u : plan_.units()) {
        if (plan_.part_size(u) == 0) continue;
        if (narrow(u)) sums_of(plan_.part_begin(u))[0] = host::st<Act>(std::numeric_limits<float>::quiet_NaN());
        else grads_of(u)[0] = std::numeric_limits<Acc>::quiet_NaN();
        return;
      }
    }
  }
  double grad_sum_of_squares(bool without_wte, bool without_replicated) override {
    // The shard's own gradients in one pass (a GPU reads each sum back:
    // one wait, not one a unit); in the stage's buffer (zero 1) unit by unit.
    double s = 0;
    if (!in_stage_.grads) {
      s = squares(shard_grads(), n_);
      if (without_wte && wte_unit_ != nullptr) s -= squares(grads_of(*wte_unit_), plan_.part_size(*wte_unit_));
    } else {
      for (const ShardUnit& u : plan_.units())
        if (&u != wte_unit_ || !without_wte)
          s += narrow(u) ? Ops::sum_of_squares(ctx_, static_cast<const Act*>(sums_of(plan_.part_begin(u))),
                                               plan_.part_size(u))
                         : Ops::sum_of_squares(ctx_, static_cast<const Acc*>(grads_of(u)),
                                               plan_.part_size(u));
    }
    // Rows [r0, r1) of a tensor's owned part, wherever they are.
    auto rows_squares = [&](const ParameterSpec& spec, const TensorPart& p, int64_t r0, int64_t r1) {
      const int64_t rl = spec.row_length();
      if (narrow(spec))
        return Ops::sum_of_squares(ctx_, static_cast<const Act*>(sums_of(spec.offset + r0 * rl)),
                                   (r1 - r0) * rl);
      return squares(grads_of(spec, p) + (r0 - p.row_begin) * rl, (r1 - r0) * rl);
    };
    for (const auto& spec : stage_.table().specs()) {
      const TensorPart p = plan_.part_of(spec);
      if (without_replicated && spec.whole()) s -= rows_squares(spec, p, p.row_begin, p.row_end);
      const ParameterSpec::Rows r = spec.shared_rows_in(p.row_begin, p.row_end);
      if (r.end > r.begin && !spec.owns_shared()) s -= rows_squares(spec, p, r.begin, r.end);
    }
    return s;
  }

  // Bytes this rank sent to its groups since the last call, counted from
  // the collectives issued under the ring model (a reduce-scatter or
  // all-gather of n bytes over g ranks sends n (g - 1) / g per rank).
  double take_sent_bytes() override {
    const double sent = sent_;
    sent_ = 0;
    return sent;
  }

  void adamw(const AdamWParams& p) override {
    settle();
    // Held masters stay where they are (master() would map their file).
    moments_.step(moments_.holds_masters() ? nullptr : master(),
                  in_stage_.grads ? stage_.grads() : shard_grads(), p, copy_base(),
                  in_stage_.grads16 ? g16_.get() : nullptr);
    publish();
  }

 private:
  GradsFinal grads_final(bool last) {
    return [this, last](int64_t offset) {
      if (last) reduce_resident_from(offset);
      for (auto& p : pending_) p->test();  // MPI progresses inside MPI calls only
    };
  }
  // The weights this rank publishes, in shard order (null where they are
  // already in place: masters_are_weights, or the Act copy in the stage).
  Act* wshard() {
    if constexpr (std::is_same_v<Act, Acc>) return master_.get();
    else return wshard_.get();
  }
  // Where AdamW writes the Act copy (the chunks' copy offsets index it);
  // null in fp32, whose masters are what the matmuls read.
  Act* copy_base() {
    if constexpr (std::is_same_v<Act, Acc>) return nullptr;
    else return in_stage_.copy ? stage_.weights() : wshard_.get();
  }
  // The shard's reduced gradients (zero 2-3): in the back end's memory,
  // or offloaded in host memory (grads_on_host_).
  Acc* shard_grads() { return grads_on_host_ ? host_grads_.get() : g_.get(); }
  // The owned reduced gradients of unit u (of one tensor's part p): in the
  // stage's whole gradients (zero 1), else in the shard.
  // (16-bit gradients at zero 1: the units outside the windows only; the
  // blocks' and the vocabulary's are in their sums, sums_of.)
  Acc* grads_of(const ShardUnit& u) {
    return in_stage_.grads ? stage_.grads() + stage_.resident_grad_offset(plan_.part_begin(u))
                           : shard_grads() + u.shard_offset;
  }
  Acc* grads_of(const ParameterSpec& spec, const TensorPart& p) {
    return in_stage_.grads
               ? stage_.grads() +
                     stage_.resident_grad_offset(spec.offset + p.row_begin * spec.row_length())
               : shard_grads() + p.shard_offset;
  }
  // Whether a unit's (a tensor's) reduced gradients are 16-bit, in place in
  // the sums (16-bit gradients at zero 1, not offloaded: the blocks' and
  // the windowed vocabulary's), and the sums of a table offset there.
  bool narrow(const ShardUnit& u) const { return in_stage_.grads16 && grads_windowed(u); }
  bool narrow(const ParameterSpec& spec) const { return narrow(plan_.unit_at(spec.offset)); }
  Act* sums_of(int64_t table_offset) {
    return g16_.get() + stage_.layout().sums_offset(table_offset, vocab_);
  }
  // Where unit u's reduce-scatter (outside the blocks) lands: its owned
  // gradients, or offloaded, its place in the device's resident parts.
  Acc* reduced_into(const ShardUnit& u) {
    if (!grads_on_host_) return grads_of(u);
    return resident_.get() + resident_at_[static_cast<size_t>(&u - plan_.units().data())];
  }
  // A sum of squares of the shard's gradients, where they live.
  double squares(const Acc* x, int64_t n) {
    if constexpr (std::is_same_v<Acc, float>)
      if (grads_on_host_) return host::sum_of_squares(x, n);
    return Ops::sum_of_squares(ctx_, x, n);
  }
  // With masters_are_weights (fp32 only), the masters of the elements at
  // stage offset `at`: the stage's weights there (every unit resident).
  Acc* weights_as_masters(int64_t at) {
    if constexpr (std::is_same_v<Act, Acc>) return stage_.weights() + at;
    else return nullptr;  // alias_ is false in mixed precision
  }
  void refresh_wshard() {
    if constexpr (!std::is_same_v<Act, Acc>) {
      if (moments_.holds_masters()) {
        moments_.write_weights(copy_base());
      } else if (!in_stage_.copy) {
        Ops::convert(ctx_, wshard_.get(), master_.get(), n_);
      } else {
        for (const ShardUnit& u : plan_.units())
          Ops::convert(ctx_, stage_.weights() + plan_.part_begin(u), master_.get() + u.shard_offset,
                       plan_.part_size(u));
      }
    }
  }
  // Whether unit u is one of the vocabulary's tensors going through the
  // windows (its gradients at zero 2-3, its weights too at zero 3:
  // StageLayout::windows_vocab).
  bool vocab_unit(const ShardUnit& u) const { return vocab_ && stage_.layout().is_vocab(u.begin); }
  bool windowed(const ShardUnit& u, int min_zero) const {
    return (u.block >= 0 || vocab_unit(u)) && zero_ >= min_zero;
  }
  // Whether the stage computes unit u's gradients in a window (zero 2-3,
  // or 16-bit gradients; the windowed vocabulary), not into its whole
  // gradients.
  bool grads_windowed(const ShardUnit& u) const { return (u.block >= 0 && gwin_) || vocab_unit(u); }
  int window_of(int64_t id) const { return stage_.layout().window_of(id); }
  // The group unit u is cut over; the bytes a collective of it sends.
  Communicator& group(const ShardUnit& u) { return u.experts ? *experts_ : *dp_; }
  // (`elements` of it: a window's share of the unit, a vocabulary piece.)
  void count_sent(const ShardUnit& u, size_t element) { count_sent(u, u.end - u.begin, element); }
  void count_sent(const ShardUnit& u, int64_t elements, size_t element) {
    const double g = plan_.group_size(u);
    sent_ += static_cast<double>(elements) * static_cast<double>(element) * (g - 1) / g;
  }
  // Where block i's window (or a vocabulary piece's) starts and ends in
  // the stage's flat buffer.
  int64_t window_begin(int64_t i) const {
    int64_t begin = -1;
    plan_.for_window(i, [&](const WindowPart& p) {
      if (begin < 0) begin = p.begin;
    });
    return begin;
  }
  int64_t window_end(int64_t i) const {
    int64_t end = 0;
    plan_.for_window(i, [&](const WindowPart& p) { end = p.end; });
    return end;
  }

  // Every unit whose weights the stage keeps whole gets every rank's part;
  // windowed blocks are gathered when needed. The gathers are waited for
  // where the next forward first uses each unit (need_published): on a
  // device the compute stream waits there, so the forward's first blocks
  // run while the later blocks' weights still arrive (Megatron's
  // overlapped parameter gather). Host MPI moves a transfer only while it
  // is waited on, and holds a temporary of its whole input meanwhile: at
  // most kInFlight at once there.
  void publish() {
    settle();
    for (auto& h : holds_) h = -1;  // the windows hold old weights now
    for (const ShardUnit& u : plan_.units()) {
      if (windowed(u, 3)) continue;
      Act* whole = stage_.weights() + stage_.resident_weight_offset(u.begin);
      Act* mine = whole + (plan_.part_begin(u) - u.begin);
      if (!alias_ && !in_stage_.copy)
        Ops::copy(ctx_, mine, static_cast<const Act*>(wshard() + u.shard_offset), plan_.part_size(u));
      if (Ops::kHostMemory && published_.size() >= kInFlight) {
        held(*published_.front().second);
        published_.pop_front();
      }
      published_.emplace_back(use_of(u),
                              group(u).start_allgather(mine, whole, plan_.counts(u), sizeof(Act)));
      count_sent(u, sizeof(Act));
    }
    stale_ = false;
  }
  // Which of the forward's uses first reads unit u (StageLayout::use_of).
  int64_t use_of(const ShardUnit& u) const { return stage_.layout().use_of(u.begin); }
  // The forward is about to use `use` (a block, kVocabIn, kVocabOut).
  void need_published(int64_t use) {
    for (auto it = published_.begin(); it != published_.end();) {
      if (it->first != use) {
        ++it;
        continue;
      }
      held(*it->second);
      it = published_.erase(it);
    }
  }
  // Before anything but the forward reads or writes the weights (AdamW
  // writes the parts the gathers send; a restore publishes anew).
  void settle() {
    for (auto& p : published_) p.second->wait();
    published_.clear();
  }

  // zero 3: block i's weights (or a vocabulary use's) into its window,
  // then block `next`'s on its way.
  void need_weights(int64_t i, int64_t next) {
    gather(i);
    held_all(wpend_[window_of(i)]);
    if (next >= 0) gather(next);
  }
  void gather(int64_t i) {
    const int w = window_of(i);
    if (holds_[w] == i) return;
    held_all(wpend_[w]);
    const int64_t begin = window_begin(i);
    plan_.for_window(i, [&](const WindowPart& p) {
      const ShardUnit& u = plan_.units()[p.unit];
      wpend_[w].push_back(group(u).start_allgather(wshard() + p.shard_offset,
                                                   stage_.weight_window(w) + (p.begin - begin),
                                                   *p.counts, sizeof(Act)));
      count_sent(u, p.end - p.begin, sizeof(Act));
    });
    holds_[w] = i;
  }
  // The step waiting for the data-parallel group (a reduction's free
  // slot or its sums, a gather's weights): exposed communication, as
  // finish()'s wait is, else a rank waiting on a slow peer reads as
  // computing to the straggler watch. finish() reports it.
  void held(PendingOp& op) { held_ += op.timed_wait(); }
  void held_all(std::vector<Pending>& pending) {
    for (auto& p : pending) held(*p);
    pending.clear();
  }

  // Units the stage keeps whole gradients of, at offsets >= offset, not yet
  // started: reduce-scattered into the shard.
  void reduce_resident_from(int64_t offset) {
    const auto& units = plan_.units();
    while (next_unit_ > 0 && units[next_unit_ - 1].begin >= offset) {
      const ShardUnit& u = units[--next_unit_];
      if (grads_windowed(u)) continue;
      const Acc* g = stage_.grads() + stage_.resident_grad_offset(u.begin);
      // At most kInFlight at once on the host: a host MPI's non-blocking
      // reduce-scatter holds a temporary the size of its whole input until
      // it completes (all units in flight cost a second gradient: measured,
      // gpt2-350m). Not on a device (gradient_buckets.hpp's kReductionsInFlight).
      if (Ops::kHostMemory && pending_.size() >= kInFlight) {
        held(*pending_.front());
        pending_.erase(pending_.begin());
      }
      pending_.push_back(group(u).start_reduce_scatter_sum(g, reduced_into(u), plan_.counts(u)));
      count_sent(u, sizeof(Acc));
    }
  }

  // Block i's gradients (or a vocabulary use's) are in gradient window w
  // (this micro-batch's): at zero 2-3 reduced now; with 16-bit gradients
  // first taken into 16 bits (the header), at zero 1 reduced once the last
  // micro-batch's are in.
  void block_ready(int64_t i, int w) {
    if (!grad16_) {
      reduce_block(i, w);
      return;
    }
    const int64_t begin = window_begin(i), n = window_end(i) - begin;
    if (zero_ == 1) {
      Act* sums = sums_of(begin);
      Ops::add_into(ctx_, sums, static_cast<const Acc*>(stage_.grad_window(w)), n);
      // A tied wte on a stage with both ends is final after the
      // embedding's backward, not the head's.
      const StageLayout& at = stage_.layout();
      const bool tied_head = i < 0 && StageLayout::piece_use(i) == StageLayout::kVocabOut &&
                             at.vocab_out.begin == at.vocab_in.begin;
      if (last_ && !tied_head) reduce_block(i, w, sums);
    } else {
      Ops::convert(ctx_, send16_[w].get(), stage_.grad_window(w), n);
      reduce_block(i, w, send16_[w].get());
    }
  }
  // Block i's gradients (its window's floats, or `g16`: its 16-bit
  // gradients), each unit reduce-scattered into a receive buffer (the
  // block's parts one after another) that drain() adds to the shard.
  void reduce_block(int64_t i, int w, Act* g16 = nullptr) {
    const int64_t block_begin = window_begin(i);
    int64_t at = 0;
    plan_.for_window(i, [&](const WindowPart& p) {
      const ShardUnit& u = plan_.units()[p.unit];
      if (g16 != nullptr) {
        // Zero 1's sums reduce in place, onto their owned rows.
        Act* recv = in_stage_.grads16 ? g16 + (p.mine - block_begin) : recv16_[w].get() + at;
        gpend_[w].push_back(group(u).start_reduce_scatter_sum(g16 + (p.begin - block_begin), recv,
                                                              *p.counts, Ops::kActElement));
        count_sent(u, p.end - p.begin, sizeof(Act));
      } else {
        gpend_[w].push_back(group(u).start_reduce_scatter_sum(
            stage_.grad_window(w) + (p.begin - block_begin), recv_[w].get() + at, *p.counts));
        count_sent(u, p.end - p.begin, sizeof(Acc));
      }
      at += p.size;
    });
    gblock_[w] = i;
    if constexpr (!Ops::kHostMemory) {
      if (grads_on_host_ && i >= 0) {
        // Down once the sums are made, on the copy stream: the host waits
        // for them at drain, when the window is next taken.
        auto& io = Ops::offload_copies(ctx_);
        for (auto& op : gpend_[w]) op->order_stream(io.down_stream());
        // And after the compute stream's work so far: a group of one, or a
        // host-staged sum (whose order_stream completes it, its result
        // uploaded on the compute stream), writes recv_ there.
        io.begin();
        io.download(recv_host_[w].get(), recv_[w].get(), sizeof(Acc) * static_cast<size_t>(at));
        io.downloaded(w);
      }
    }
  }
  void drain(int w) {
    if (gpend_[w].empty()) return;
    held_all(gpend_[w]);
    if (in_stage_.grads16) return;  // reduced in place, where AdamW reads them
    // A vocabulary use's sums stay on the device, offloaded or not: added
    // into its resident parts (their tied pair is summed there), else into
    // the shard.
    const bool stays = gblock_[w] < 0;
    if constexpr (!Ops::kHostMemory)
      if (grads_on_host_ && !stays) Ops::offload_copies(ctx_).wait_downloaded(w);
    int64_t at = 0;
    plan_.for_window(gblock_[w], [&](const WindowPart& p) {
      const ShardUnit& u = plan_.units()[p.unit];
      if (stays && !grad16_) {
        Ops::add_into(ctx_, reduced_into(u) + (p.shard_offset - u.shard_offset),
                      static_cast<const Acc*>(recv_[w].get() + at), p.size);
      } else if (grads_on_host_) {
        Acc* dst = host_grads_.get() + p.shard_offset;
        const Acc* src = recv_host_[w].get() + at;
        if (fresh_[p.unit]) std::copy(src, src + p.size, dst);
        else host::residual_forward(dst, dst, src, p.size);
        fresh_[p.unit] = 0;
      } else if (grad16_) {
        Ops::add_into(ctx_, g_.get() + p.shard_offset,
                      static_cast<const Act*>(recv16_[w].get() + at), p.size);
      } else {
        Ops::add_into(ctx_, g_.get() + p.shard_offset, static_cast<const Acc*>(recv_[w].get() + at),
                      p.size);
      }
      at += p.size;
    });
  }

  GptStage<Ops>& stage_;
  typename Ops::Context& ctx_;
  int zero_;
  ShardPlan plan_;
  int64_t n_;
  bool alias_;  // masters_are_weights
  bool grad16_;  // [train] grad_dtype = bf16 (the header)
  bool gwin_;    // the stage computes the blocks' gradients in windows
  ShardInStage in_stage_;
  bool grads_on_host_;  // gradients_offloaded (the header)
  // The vocabulary's gradients go through the windows (zero 2-3; its
  // weights too at zero 3): GptStage::vocab_grads_windowed.
  bool vocab_;
  AdamWState<Ops> moments_;
  Buffer<Acc> master_, g_;
  Buffer<Act> wshard_;  // mixed precision only
  Buffer<Acc> recv_[2];
  // 16-bit gradients: the blocks' sums over a step (zero 1; the stage's
  // block span), a window's rounded gradients (zero 2-3), each window's
  // reduced parts.
  Buffer<Act> g16_, send16_[2], recv16_[2];
  bool last_ = false;  // the backward running is of the step's last micro-batch
  // Offloaded gradients: the shard in host memory, the two windows'
  // staging, which units had no sum yet this step, and on the device the
  // units outside the blocks (each one's place there, -1 for blocks).
  HostBuffer<Acc> host_grads_;
  HostBuffer<Acc> recv_host_[2];
  std::vector<char> fresh_;
  Buffer<Acc> resident_;
  std::vector<int64_t> resident_at_;
  const ShardUnit* wte_unit_ = nullptr;
  Communicator* dp_ = nullptr;
  Communicator* experts_ = nullptr;  // dp_ unless expert parallel
  bool stale_ = true;
  size_t next_unit_ = 0;
  std::vector<Pending> pending_;
  // publish()'s gathers not yet waited for, by the forward's use that
  // first reads their unit (use_of), in the order they were started.
  std::deque<std::pair<int64_t, Pending>> published_;
  std::vector<Pending> gpend_[2], wpend_[2];
  // The block (or vocabulary use) each window's sums belong to.
  int64_t gblock_[2] = {-1, -1};
  int64_t holds_[2] = {-1, -1};
  double sent_ = 0;  // bytes sent by the collectives issued
  double held_ = 0;  // seconds waited (held()) this step, before finish()
  double allocated_ = 0;
};

}  // namespace mpiformer
