// One pipeline stage of a decoder (GPT-2 or Llama, core/gpt_config.hpp): an
// optional embedding, a range of transformer blocks, and optionally the
// final norm, the LM head and the loss. The families differ in a few ops
// (the norm, the MLP's activation, rotary positions) and their widths; the
// buffers, schedules and parallel axes are one.
// Written once for every device: `Ops` is a device's op set (host/ops.hpp,
// cuda/ops.hpp), which supplies the buffers, the context (stream, BLAS
// handle, scratch) and one function per op. The stage does not know who
// sends it activations or receives its gradients: the trainer moves them.
//
// Buffers are planned once at construction for a fixed micro-batch shape
// [B, T]; nothing is allocated during forward or backward. Activations live
// in `slots`, one per micro-batch that may be in flight at once (1 without
// pipelining); backward scratch is shared by all slots. StageOptions says
// what backward recomputes instead of keeping, and (ZeRO) which parameter
// buffers live outside the stage or in windows filled through BlockHooks.
//
// Types: Act for activations and the weights the matmuls read; Acc for the
// master weights, gradients, LayerNorm statistics and losses. They are the
// same type except in mixed precision on a GPU (bf16 / float), where the
// stage keeps an Act copy of the weights, refreshed by AdamW.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "common/attention_storage.hpp"
#include "host/ops.hpp"
#include "core/gpt_config.hpp"
#include "model/moe_plan.hpp"
#include "model/parameter_table.hpp"
#include "model/stage_layout.hpp"
#include "model/stage_options.hpp"

namespace mpiformer {

// Called during backward each time every gradient at offsets >= `offset`
// has received the micro-batch's contribution (after the head, after each
// block, and with 0 at the end), so a caller can start reducing them while
// the rest of the backward runs.
using GradsFinal = std::function<void(int64_t offset)>;

// How a ZeRO trainer fills and drains the stage's block windows. Block i
// (the stage's i-th) uses weight window i % 2 (at zero 3 the
// vocabulary's uses go through them too, piece by piece, as i =
// StageLayout::piece_id of kVocabIn and kVocabOut: their window is
// StageLayout::window_of). The gradient
// windows are taken in turn, one use after another, whichever block: the
// window a use gets is the one whose reduction started longest ago, even
// where consecutive uses are of blocks of one parity (interleaved chunks
// of one block, each run for several micro-batches in a row).
struct BlockHooks {
  // window_weights: on return weight window i % 2 holds block i's weights;
  // `next` (-1: none) is the block the stage needs after it, which may be
  // fetched ahead into the other window.
  std::function<void(int64_t i, int64_t next)> need_weights;
  // window_grads: before block i's backward, once gradient window w may be
  // overwritten (the stage then zeroes it) ...
  std::function<void(int64_t i, int w)> need_grad_window;
  // ... and after it, when window w holds this micro-batch's gradients of
  // block i.
  std::function<void(int64_t i, int w)> grads_ready;
  // Before the forward first uses block i's weights (kept whole), or the
  // embedding's (i = StageLayout::kVocabIn) or the final norm's and
  // head's (kVocabOut): the optimizer's last update of them must be in.
  std::function<void(int64_t i)> need_published;
};

// The stage's tensor-parallel group (range().tp > 1), as Megatron divides a
// block: qkv and fc column-parallel, the two output projections
// row-parallel, the embedding and LM head vocabulary-parallel. The group
// sums, in place and identically on every rank, the row-parallel outputs
// and the embedding (forward), the column-parallel layers' input gradients
// (backward), and the cross-entropy's statistics; and takes their maximum.
// `type` is the buffer's element type. The trainer provides them (the stage
// does not know the communicator).
//
// Under sequence parallelism (StageOptions::sequence_parallel) the group
// also scatters and gathers rows: each rank holds one tp-th of the
// micro-batch's B*T rows of the residual stream (the rows of rank r are
// [r R, (r + 1) R), R = B*T / tp), LayerNorms and residual adds run on
// them, and the column-parallel GEMMs read the gathered rows. scatter_sum
// sums `whole` (tp parts of `part` elements) over the group and leaves
// part rank() in `mine`; gather puts every rank's `mine` at its place in
// `whole`.
//
// Backward starts the sum of a column-parallel layer's input gradient,
// computes the layer's weight gradient (which does not read it), then
// waits: start_sum and start_scatter_sum return the wait.
//
// Without sequence parallelism the vocabulary-parallel embedding is not
// summed (a [B*T, C] all-reduce of mostly zeros): each rank embeds the
// positions whose tokens its vocabulary rows hold, and gather_parts puts
// every rank's `counts[r]` elements, in rank order, into `whole`.
struct TensorGroup {
  using Wait = std::function<void()>;
  std::function<void(void* data, int64_t n, Element type)> sum, max;
  std::function<void(const void* whole, void* mine, int64_t part, Element type)> scatter_sum;
  std::function<void(const void* mine, void* whole, int64_t part, Element type)> gather;
  std::function<void(const void* mine, void* whole, const std::vector<int64_t>& counts,
                     Element type)>
      gather_parts;
  std::function<Wait(void* data, int64_t n, Element type)> start_sum;
  std::function<Wait(const void* whole, void* mine, int64_t part, Element type)> start_scatter_sum;
};

// Expert parallelism (StageRange::ep > 1): the ranks of the data-parallel
// group dividing each sparse layer's experts. allgather gives every rank's
// `n` row counts (host memory); alltoallv sends block r of `send`
// (send_bytes[r], in rank order) to rank r and receives rank r's into
// block r of `recv` (the stage's memory). The trainer provides them.
struct ExpertGroup {
  std::function<void(const int64_t* mine, int64_t* all, int64_t n)> allgather;
  std::function<void(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                     const std::vector<int64_t>& recv_bytes)>
      alltoallv;
};

// Context parallelism (StageOptions::cp > 1): the ranks holding the other
// chunks of the micro-batch's sequences. forward: attention of this rank's
// queries over every rank's keys, qkv [B*T, qkv width] (T: this rank's
// tokens per sequence, chunk-major) into out [B*T, C / tp] and each query
// row's log-sum-exp into lse [B, heads, T] (the attention state, kept
// for backward); backward: dqkv [B*T, qkv width], overwritten, its keys'
// and values' rows summed over every rank's queries. Under a document
// mask `positions` [B*T] (the stage's memory) are the rows' positions in
// their documents, and a query sees its own document's keys only
// (nullptr otherwise). The trainer provides them
// (train/context_attention.hpp); the element types are the stage's Act and
// AttnState. A Mixture of Experts' router exchanges its counts over the
// same group (`router`), knowing this rank's place in it (`rank`) and
// which chunks each rank holds (`order`).
struct ContextGroup {
  std::function<void(const void* qkv, void* out, void* lse, const int32_t* positions)> forward;
  std::function<void(const void* qkv, const void* out, const void* lse, const void* dout,
                     void* dqkv, const int32_t* positions)>
      backward;
  RouterExchange router;
  int64_t rank = 0;
  ContextChunks order = ContextChunks::kHeadTail;
};

template <class Ops>
class GptStage {
 public:
  using Act = typename Ops::Act;
  using Acc = typename Ops::Acc;
  using Context = typename Ops::Context;
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;

  // `ctx` must outlive the stage.
  GptStage(Context& ctx, const GptConfig& cfg, const StageRange& range,
           const StageOptions& options);
  GptStage(Context& ctx, const GptConfig& cfg, const StageRange& range, int64_t micro_batch,
           int num_slots)
      : GptStage(ctx, cfg, range, StageOptions{micro_batch, SlotKinds::any(num_slots)}) {}
  GptStage(const GptStage&) = delete;
  GptStage& operator=(const GptStage&) = delete;

  Context& context() { return ctx_; }
  const GptConfig& config() const { return cfg_; }
  const StageRange& range() const { return range_; }
  const ParameterTable& table() const { return table_; }
  const StageLayout& layout() const { return at_; }
  const StageOptions& options() const { return opt_; }
  int num_slots() const { return static_cast<int>(slots_.size()); }
  int64_t param_storage() const { return table_.total_storage(); }
  // Bytes of every buffer the constructor allocated (what stage_footprint
  // predicts; the context's scratch is not the stage's).
  int64_t allocated_bytes() const { return allocated_; }
  // Elements of the residual stream this rank holds of one micro-batch:
  // [B*T, C], or its tp-th of the rows under sequence parallelism. What
  // travels between stages.
  int64_t activation_size() const { return rows_ * cfg_.n_embd; }

  // Master weights and gradients (flat, table order, device memory). With
  // external_master there is no params(); with window_grads (window_weights)
  // grads() (weights()) holds the tensors outside the blocks only, at
  // resident_grad_offset() (resident_weight_offset()) of their table offset.
  Acc* params() { return params_.get(); }
  Acc* grads() { return grads_.get(); }
  // The weights the matmuls read: params() itself, or its Act copy.
  // refresh_weights() re-derives the copy after params() changed outside
  // the optimizer (initialisation, restore).
  Act* weights() { return weights_; }
  void refresh_weights();
  // (At zero 2-3 the vocabulary's gradients, at zero 3 its weights too,
  // may go through the windows: then they are outside grads() (weights())
  // as well, StageLayout::windows_vocab.)
  int64_t resident_weight_offset(int64_t table_offset) const {
    return at_.resident_offset(table_offset, opt_.window_weights, vocab_weights_windowed_);
  }
  int64_t resident_grad_offset(int64_t table_offset) const {
    return at_.resident_offset(table_offset, opt_.window_grads, vocab_grads_windowed_);
  }
  bool vocab_weights_windowed() const { return vocab_weights_windowed_; }
  bool vocab_grads_windowed() const { return vocab_grads_windowed_; }
  int64_t block_span() const { return at_.block_span(); }
  int64_t block_begin() const { return at_.block_begin(); }  // the blocks' first table offset
  int64_t block_storage() const { return at_.block_storage(); }  // a window's elements
  Act* weight_window(int w) { return wwin_[w].get(); }
  Acc* grad_window(int w) { return gwin_[w].get(); }
  void set_hooks(BlockHooks hooks) { hooks_ = std::move(hooks); }
  // Needed before the first forward when range().tp > 1.
  void set_tensor_group(TensorGroup group) { tp_ = std::move(group); }
  // Needed before the first forward when range().ep > 1.
  void set_expert_group(ExpertGroup group) { ep_ = std::move(group); }
  // Needed before the first forward when options().cp > 1.
  void set_context_group(ContextGroup group) {
    cp_ = std::move(group);
    moe_.router.context_rank = cp_.rank;
    moe_.router.order = cp_.order;
  }
  // Tokens per sequence this rank holds: seq_len, or its cp-th.
  int64_t tokens_per_sequence() const { return T_; }

  // GPT-2 initialisation; each tensor's values depend only on (seed, name),
  // so every layout and device initialises the same model.
  void init_parameters(uint64_t seed);
  void zero_grads();

  // Where a non-first stage's input (activation_size() elements) for
  // `slot` must be written before forward().
  Act* input_buffer(int slot) { return slots_[slot].residual[0].get(); }
  // Forward of one micro-batch into `slot`. tokens and targets [B,T] are
  // host memory: the first stage embeds `tokens`, the last computes the
  // per-token losses against `targets` and adds their sum to the loss sum.
  // With `for_backward`, the last stage also leaves dloss/dlogits (scaled by
  // grad_scale) ready for backward(). Under interleaving (range().chunks >
  // 1) forward, backward and weight_gradients run one chunk of the stage's
  // layers, the slot holding that chunk's activations; only chunk 0
  // embeds, only the last chunk ends in the head.
  // `positions` [B,T] (host): with StageOptions::document_mask, each
  // token's position in its document; under context parallelism its
  // position in the sequence (required then; nullptr otherwise). T is
  // tokens_per_sequence().
  void forward(int slot, const int32_t* tokens, const int32_t* targets, bool for_backward,
               Acc grad_scale, int chunk = 0, const int32_t* positions = nullptr);
  // The residual stream leaving this stage (activation_size(); non-last
  // stages).
  const Act* output(int slot) const { return slots_[slot].residual.back().get(); }

  // Where a non-last stage's output gradient (activation_size()) must be
  // written before backward().
  Act* output_grad_buffer() { return grad_in_.get(); }
  // Backward of the micro-batch in `slot`; parameter gradients accumulate.
  // Backward runs from the end of the parameter buffer to its start.
  // Under split_backward it computes the input gradient only (B), and
  // keeps in the slot what weight_gradients needs: each layer's output
  // gradient in a buffer the rest of the backward no longer reads (the
  // block's output for fc_proj, res2 for attn_proj, fch for fc, qkv for
  // qkv, the stage's input for the embedding) and the LayerNorms' weight
  // gradients; grads_final and the gradient windows are then W's. The
  // head's weight gradient stays B's (see head_of).
  void backward(int slot, const GradsFinal& grads_final = nullptr, int chunk = 0);
  // W (split_backward only): the weight gradients of the micro-batch in
  // `slot`, whose B ran, from its end to its start as backward would.
  // The slot stays held until then.
  void weight_gradients(int slot, const GradsFinal& grads_final = nullptr, int chunk = 0);
  // Gradient with respect to this stage's input (activation_size();
  // non-first stages), valid until the next backward.
  const Act* input_grad() const { return dres_.get(); }

  // Sum of the per-token losses of every forward since the last call
  // (waits for the device).
  double take_loss_sum();
  // A Mixture of Experts' routing since the last call (forwards of every
  // kind; recomputation's are not counted twice): adds to totals
  // [kRouterTotals] (common/moe_routing.hpp: the sums of the aux and z
  // losses and the assignments dropped) and to load [n_layer x experts]
  // the rows each expert of each of the stage's sparse layers took (at
  // the model's layer), then starts again from zero.
  void take_router_stats(double* totals, double* load);
  // Logits [B*T, this rank's share of the padded vocabulary] of the last forward into `slot` made without
  // for_backward (with it, their gradient), and its per-token losses [B*T].
  const Act* logits(int slot) const { return head_of(slot).logits.get(); }
  const Acc* losses(int slot) const { return head_of(slot).losses.get(); }

 private:
  using AttnState = typename Ops::AttnState;
  // fch: the MLP's first projection's output (SwiGLU: gate and up);
  // fch_gelu: its activation (GELU, or SwiGLU's product). RMSNorm keeps no
  // means (Llama's ln*_mean are empty).
  //
  // A sparse block's fch and fch_gelu hold its experts' rows, as
  // dispatched (moe_plan's rows at most), y their outputs, and the router
  // keeps its decisions (host/moe_router.hpp's names), kept_host the rows
  // per expert where the host sizes the experts' GEMMs from. Under expert
  // parallelism fch and fch_gelu hold the rows this rank's experts
  // received (by source rank, then expert), xr those rows themselves,
  // counts every rank's kept_host; y this rank's tokens' outputs, back;
  // under split backward dyr the received rows' output gradients, which B
  // leaves for W.
  struct LayerActs {
    Buffer<Act> ln1, qkv, atty, res2, ln2, fch, fch_gelu, y;
    Buffer<Acc> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
    // What attention keeps for its backward (common/attention_storage.hpp).
    Buffer<AttnState> att;
    Buffer<Acc> probs, lse, gate;
    Buffer<int32_t> expert, dest, chose;
    Buffer<int64_t> kept;
    std::vector<int64_t> kept_host;
    Buffer<Act> xr, dyr;
    std::vector<int64_t> counts;
  };
  // Under sequence parallelism ln1, res2, ln2 and the LayerNorm statistics
  // hold this rank's rows only.
  // A slot holds one chunk's layers (all the stage's without interleaving).
  struct Slot {
    std::vector<Buffer<Act>> residual;  // [layers + 1][rows * C]
    std::vector<LayerActs> layers;
    Buffer<Act> lnf, logits;
    Buffer<Acc> lnf_mean, lnf_rstd, losses;
    // Split backward: the blocks' LayerNorm weight gradients B computed,
    // 4 C per block.
    Buffer<Acc> ln_grads;
    typename Ops::Tokens tokens, targets;
    typename Ops::Tokens positions;  // document_mask only
    Acc grad_scale = 0;  // the forward's: the router's losses' weight in backward
  };
  // The group's in-place sum (no-op at tp = 1).
  template <class U>
  void tp_sum(U* data, int64_t n) {
    if (range_.tp > 1) tp_.sum(data, n, element<U>());
  }
  // The element type of a buffer of U (the plan's activation type for Act).
  template <class U>
  static constexpr Element element() {
    if constexpr (std::is_same_v<U, Act>) return Ops::kActElement;
    else return sizeof(U) == 8 ? Element::kF64 : Element::kF32;
  }
  // Sequence parallelism's two moves, written so the stage reads the same
  // without it. gathered: the whole [B*T, C] of rows a rank holds a part
  // of (in the shared full_ buffer), or `rows` itself. sum_target: where a
  // row-parallel GEMM writes its partial sums meant for `rows`; summed:
  // the group's sum of them in `rows`.
  const Act* gathered(const Act* rows);
  Act* sum_target(Act* rows) { return opt_.sequence_parallel ? full_.get() : rows; }
  void summed(const Act* partial, Act* rows);
  // The column-parallel backward's partial input gradients (dln_, whole
  // rows) summed over the group, started: the returned function waits and
  // gives the sum (dln_ in place, or this rank's rows of it).
  std::function<Act*()> start_input_grad_sum();
  // A column-parallel layer's backward: its input gradient into dln_, the
  // group's sum of it started, its weight gradient meanwhile; the sum.
  Act* column_parallel_backward(Acc* dw, Acc* db, const Act* dout, const Act* inp, const Act* w,
                                int64_t OC);
  // LayerNorm weight gradients computed from this rank's rows only
  // (sequence parallelism) go to ln_grads_ and are summed over the group
  // before they join the gradients; those B computes under split backward
  // wait in the slot for W (the final LayerNorm's are B's). ln_stash:
  // where block `i`'s (-1: the final LayerNorm's) go, null for straight
  // into the gradients; ln_grad: the k-th of them there, or `g`.
  Acc* ln_stash(Slot& s, int64_t i);
  Acc* ln_grad(Acc* stash, Acc* g, int k) { return stash ? stash + k * cfg_.n_embd : g; }
  // The family's norm (LayerNorm, or RMSNorm: no mean, no bias) over `N`
  // rows, forward and backward (dinp accumulates, as both kernels do).
  void norm_forward(Act* out, Acc* mean, Acc* rstd, const Act* x, const Act* w, const Act* b,
                    int64_t N);
  void norm_backward(Act* dinp, Acc* dw, Acc* db, const Act* dout, const Act* x, const Act* w,
                     const Acc* mean, const Acc* rstd, int64_t N);
  // The MLP's activation and its backward (dinp may be inp) on `rows`
  // rows (-1: the micro-batch's B*T).
  void activation_forward(Act* out, const Act* inp, int64_t rows = -1);
  void activation_backward(Act* dinp, const Act* inp, const Act* dout, int64_t rows = -1);
  // Whether the stage's block i is sparse (a Mixture of Experts).
  bool sparse(int64_t i) const { return cfg_.moe_layer(range_.layer(i)); }
  // A sparse block's MLP from its ln2 into `mlp` (the row-parallel partial
  // sums, as the dense MLP's projection leaves them): route, dispatch,
  // each expert's MLP on its rows, combine. `counted`: the routing joins
  // the stats (not when recomputed).
  void moe_forward(LayerActs& a, Act* mlp, const BlockView<const Act>& w, int64_t i, bool counted);
  // Its backward from the block's output gradient `dres`: the experts',
  // the router's (with the aux and z losses' weights of the slot's
  // forward) and the dispatch's; returns ln2's output gradient, summed
  // over the tensor group (this rank's rows under sequence parallelism).
  // Split (B), no weight gradient: it keeps what moe_weight_gradients (W)
  // reads in buffers of `a` it has done with.
  const Act* moe_backward(LayerActs& a, const Act* dres, const BlockView<const Act>& w,
                          const BlockView<Acc>& g, Acc grad_scale);
  void moe_weight_gradients(LayerActs& a, const BlockView<Acc>& g);
  // f(local expert, first row, rows) for each block of rows this rank's
  // experts compute, in order (by source rank, then expert); the rows.
  template <class F>
  int64_t for_expert_blocks(const LayerActs& a, F f) const;
  // Expert parallelism: this rank's tokens' rows (`from`, by expert) to
  // the ranks holding their experts (`to`, by source rank then expert), or
  // (to_experts false) the experts' rows back to their tokens' ranks.
  void expert_exchange(const LayerActs& a, const Act* from, Act* to, bool to_experts);
  // Llama's rotary positions on qkv's q and k heads (sign -1: backward).
  void rotate(Act* qkv, float sign);
  // The positions of the micro-batch the stage is working on (its slot's,
  // set by forward, backward and weight_gradients), or nullptr.
  const typename Ops::Tokens* positions_ = nullptr;
  void use_positions(Slot& s) { positions_ = opt_.positions_given() ? &s.positions : nullptr; }
  // Attention of block activations `a` (state: attention_state(a) or the
  // recomputation's): the op set's kernel, or across the context group.
  void attend(LayerActs& a, AttnState* state);
  // The rows' positions in their documents under the document mask (the
  // stage's memory), or nullptr.
  const int32_t* document_positions() const {
    return opt_.document_mask ? data_of(positions_) : nullptr;
  }
  void attend_backward(LayerActs& a, AttnState* state);
  void add_ln_grads(Acc* stash, std::initializer_list<Acc*> grads);
  bool split() const { return opt_.split_backward; }
  // The slot holding `s`'s head buffers (lnf, logits, losses, targets):
  // under split backward or interleaving one set serves every slot, since
  // the last stage runs each micro-batch's (last chunk's) backward right
  // after its forward and the backward finishes with them (B computes the
  // head's weight gradient too).
  bool shared_head() const { return split() || range_.chunks > 1; }
  Slot& head_of(Slot& s) { return shared_head() ? slots_[0] : s; }
  const Slot& head_of(int slot) const { return slots_[shared_head() ? 0 : slot]; }
  // Whether `chunk` embeds (the model's first) or ends in the head (its last).
  bool embeds(int chunk) const { return range_.has_embedding && chunk == 0; }
  bool heads(int chunk) const { return range_.has_head && chunk == range_.chunks - 1; }
  // The slot position of the stage's block i (StageRange::slot_position).
  int64_t in_slot(int64_t i) const { return range_.slot_position(i); }
  // Where the embedding writes chunk 0's stream, and where the head reads
  // the last chunk's: a short first chunk's blocks end at the slot's end,
  // a short last chunk's start at its start (the slot's first and last
  // buffers are then the input and output every other chunk uses).
  Act* embedded(Slot& s) { return s.residual[static_cast<size_t>(range_.first_short)].get(); }
  Act* stream_end(Slot& s) {
    return s.residual[static_cast<size_t>(range_.full_chunk() - range_.last_short)].get();
  }
  void head_loss(Slot& s, bool for_backward, Acc grad_scale);
  // The embedding of `s`'s tokens (host copy `tokens`) into its residual
  // stream: summed over the vocabulary-parallel group under sequence
  // parallelism (a reduce-scatter), gathered by token rows otherwise.
  void embed(Slot& s, const int32_t* tokens);
  bool gathers_embedding() const {
    return range_.tp > 1 && range_.has_embedding && !opt_.sequence_parallel;
  }
  // Block i's forward from x into out, keeping what backward needs in `a`.
  void forward_block(LayerActs& a, const Act* x, Act* out, int64_t i, bool recomputing = false);
  void backward_block(Slot& s, int64_t i);
  void weight_gradients_block(Slot& s, int64_t i);
  BlockView<const Act> block_weights(int64_t i);
  BlockView<Acc> block_grads(int64_t i);
  // Null where the stage (or the family) has no such tensor. (Not wte's
  // weights: the embedding reads them as w_vocab.)
  const Act* w_outer(outer::Tensor k) const {
    return at_.at(k) < 0 ? nullptr : weights_ + resident_weight_offset(at_.at(k));
  }
  Acc* g_outer(outer::Tensor k) {
    if (k == outer::wte && vocab_grads_windowed_) return gwin_[grad_window_].get();
    return at_.at(k) < 0 ? nullptr : grads_.get() + resident_grad_offset(at_.at(k));
  }
  // A vocabulary use's piece `id` (StageLayout::piece_id): its window, or
  // where it starts in the whole tensor kept (piece 0: the whole): the
  // embedding's wte, or the LM head (its own tensor, or the tied embedding).
  const Act* w_vocab(int64_t id) const {
    if (vocab_weights_windowed_) return wwin_[at_.window_of(id)].get();
    const int64_t at = StageLayout::piece_index(id) > 0 ? at_.piece(id).begin
                       : StageLayout::piece_use(id) == StageLayout::kVocabIn ? at_.at(outer::wte)
                                                                             : at_.head();
    return weights_ + resident_weight_offset(at);
  }
  // A use's pieces for its weights (the forward: one unless they go
  // through the windows) and for its gradients (the backward: one unless
  // those do), and piece k of n's first row and rows of this rank's vl_.
  int64_t weight_pieces(int64_t use) const {
    return vocab_weights_windowed_ ? at_.vocab_pieces(use) : 1;
  }
  int64_t grad_pieces(int64_t use) const {
    return vocab_grads_windowed_ ? at_.vocab_pieces(use) : 1;
  }
  std::pair<int64_t, int64_t> piece_rows(int64_t use, int64_t k, int64_t n) const {
    if (n == 1) return {0, vl_};
    const int64_t id = StageLayout::piece_id(use, k);
    return {at_.piece_row(id), at_.piece(id).rows};
  }
  // The head's backward, piece by piece: its input gradient (summed over
  // the tensor group) and its weight gradient.
  const Act* head_backward(Slot& h);
  // The embedding's backward from its output's gradient `dout`.
  void embedding_backward(const Act* dout, const Slot& s);
  Acc* g_head() {
    if (vocab_grads_windowed_) return gwin_[grad_window_].get();
    return grads_.get() + resident_grad_offset(at_.head());
  }
  // A vocabulary use's piece's window (StageLayout::piece_id): its weights
  // fetched (`weights`, the piece `next` on its way), or its gradient
  // window cleared (before) and its gradients handed over (after); nothing
  // unless the vocabulary's weights (gradients) are windowed.
  void vocab_weights(int64_t id, int64_t next = -1);
  void published(int64_t id) {
    if (hooks_.need_published) hooks_.need_published(id);
  }
  void vocab_grads_before(int64_t id);
  void vocab_grads_after(int64_t id);
  // A gradient use (block i, or a vocabulary use) takes the next window
  // in turn once its trainer frees it, and clears `size` of it.
  void take_grad_window(int64_t i, int64_t size) {
    grad_window_ ^= 1;
    hooks_.need_grad_window(i, grad_window_);
    Ops::fill_zero(ctx_, gwin_[grad_window_].get(), size);
  }
  // What attention keeps for block i's backward (the probabilities, or the
  // rows' statistics): kept per slot, or (recomputed) in the one shared
  // buffer.
  AttnState* attention_state(LayerActs& a) {
    return opt_.recompute == Recompute::kNone ? a.att.get() : rc_.att.get();
  }

  Context& ctx_;
  GptConfig cfg_;
  StageRange range_;
  StageOptions opt_;
  ParameterTable table_;
  int64_t B_, T_;
  int64_t rows_;  // rows of the residual stream held: B*T, or B*T / tp
  StageLayout at_;
  // The vocabulary's weights (zero 3), and its gradients (zero 2-3), in
  // the windows: StageLayout::windows_vocab.
  bool vocab_weights_windowed_, vocab_grads_windowed_;
  BlockHooks hooks_;
  TensorGroup tp_;
  ContextGroup cp_;
  // This rank's widths under tensor parallelism: query heads, kv heads,
  // query channels (C / tp), key (= value) channels, the fused qkv's
  // outputs, the MLP's hidden channels (ffn / tp) and its first
  // projection's outputs (SwiGLU: twice that); its share of the padded
  // vocabulary, the real tokens in it and the first of them.
  int64_t nh_, nkv_, ca_, kv_, cqkv_, cm_, cin_, vl_, v_real_, v0_;
  Buffer<float> rope_;  // Llama: host/rope.hpp's table
  Buffer<Act> wwin_[2];
  Buffer<Acc> gwin_[2];
  // The gradient window of the use in progress (take_grad_window); the
  // next use takes the other (the first, window 0).
  int grad_window_ = 1;
  // Recomputation's shared buffers: the probabilities (attention), or one
  // block's whole activations and output (full).
  LayerActs rc_;
  Buffer<Act> rc_out_;
  Buffer<Acc> params_, grads_;
  Buffer<Act> weight_copy_;  // mixed precision only
  Act* weights_ = nullptr;
  std::vector<Slot> slots_;
  // Backward scratch, shared by all slots, and the output gradient's inbox.
  // d4_: the MLP's first projection's output gradient; dact_ (Llama) its
  // activation's, which SwiGLU's backward (unlike GELU's) cannot write in
  // place (it is half as wide).
  Buffer<Act> dres_, dln_, datty_, dqkv_, d4_, dact_, grad_in_;
  Buffer<AttnState> datt_;  // attention's backward scratch
  Buffer<double> loss_sum_;
  // The vocabulary-parallel cross-entropy's row statistics (tp > 1).
  Buffer<Acc> ce_max_, ce_stats_;
  Buffer<Acc> head_dx_;  // head_backward's sum over the pieces
  // Sequence parallelism: the gathered rows (or a row-parallel GEMM's
  // partial sums), this rank's rows of a summed input gradient, and up to
  // two LayerNorms' weight gradients from its rows.
  Buffer<Act> full_, dln_rows_;
  Buffer<Acc> ln_grads_;
  // The embedding gathered by token rows (gathers_embedding): positions by
  // the rank holding their token, on the host and where the kernels read
  // them (the rows themselves gather in full_), each rank's count and where
  // its run starts (host vectors sized once: nothing allocated per step).
  std::vector<int32_t> row_order_host_;
  typename Ops::Tokens row_order_;
  std::vector<int64_t> row_counts_, row_starts_;
  // A Mixture of Experts' shared buffers: the router's logits (its GEMM's
  // Act, then widened; in backward their gradient), the gates' gradients,
  // the dispatched rows (forward: the experts' input; backward: the
  // experts' output gradients, then their input gradients), the experts'
  // hidden gradients (SwiGLU: its output's too), the router's scratch and
  // totals (a second set for recomputation, never read).
  // Expert parallelism: the received rows' outputs, then their gradients
  // (received and sent back), and each exchange's sizes (host, sized once).
  MoePlan moe_;
  ExpertGroup ep_;
  Buffer<Act> moe_logits_, moe_x_, moe_dx_, moe_d4_, moe_dact_, moe_yr_;
  std::vector<int64_t> ep_send_, ep_recv_;
  Buffer<Acc> moe_lg_, moe_dgate_;
  Buffer<char> router_scratch_;
  Buffer<double> router_totals_, router_discard_;
  std::vector<double> expert_load_;  // [stage block][expert], host
  int64_t allocated_ = 0;
};

template <class T>
using HostGptStage = GptStage<host::Ops<T>>;
extern template class GptStage<host::Ops<float>>;
extern template class GptStage<host::Ops<double>>;
extern template class GptStage<host::Ops<host::Bf16>>;
extern template class GptStage<host::Ops<host::Fp16>>;

}  // namespace mpiformer
