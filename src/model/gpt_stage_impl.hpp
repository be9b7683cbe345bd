// GptStage's definitions, included once per device by the file that
// instantiates the stage for that device's op set (gpt_stage_host.cpp,
// gpt_stage_cuda.cpp).
#pragma once
#include <stdexcept>

#include "model/gpt_stage.hpp"

namespace mpiformer {

template <class Ops>
GptStage<Ops>::GptStage(Context& ctx, const GptConfig& cfg, const StageRange& range,
                        const StageOptions& options)
    : ctx_(ctx),
      cfg_(cfg),
      range_(range),
      opt_(options),
      table_(cfg, range),
      B_(options.micro_batch),
      T_(cfg.seq_len / std::max<int64_t>(options.cp, 1)),
      rows_(B_ * T_),
      at_(table_, range),
      vocab_weights_windowed_(at_.windows_vocab(options.window_weights)),
      vocab_grads_windowed_(
          at_.windows_vocab(options.window_weights || options.window_vocab_grads)) {
  const int64_t tp = range_.tp;
  // The deck requires seq_len to be a multiple of 2 cp (two chunks per
  // rank).
  if (opt_.cp < 1 || (opt_.cp > 1 && cfg.seq_len % (2 * opt_.cp) != 0))
    throw std::logic_error("context parallelism needs seq_len a multiple of 2 cp");
  if (opt_.sequence_parallel) {
    // The deck requires it (tp > 1, seq_len a multiple of tp); a stage built
    // otherwise is a programming error.
    if (tp < 2 || (B_ * T_) % tp != 0)
      throw std::logic_error("sequence parallelism needs tp > 1 dividing B*T");
    rows_ = B_ * T_ / tp;
  }
  if (opt_.split_backward && opt_.recompute == Recompute::kFull)
    throw std::logic_error("split backward needs the blocks' activations kept");
  nh_ = cfg_.n_head / tp;
  nkv_ = cfg_.kv_heads_per_rank(tp);  // a kv head replicated where tp exceeds them
  ca_ = cfg_.n_embd / tp;
  kv_ = cfg_.kv_dim_per_rank(tp);
  cqkv_ = cfg_.qkv_dim_per_rank(tp);
  cm_ = cfg_.ffn() / tp;
  cin_ = cfg_.ffn_in() / tp;
  vl_ = cfg_.padded_vocab(tp) / tp;
  // The embedding and an untied head split the vocabulary alike.
  const ParameterSpec* vocab = nullptr;
  for (const auto& spec : table_.specs())
    if (spec.layer < 0 && (spec.tensor == outer::wte || spec.tensor == outer::lm_head)) vocab = &spec;
  v_real_ = vocab != nullptr ? vocab->shape[0] : 0;
  v0_ = vocab != nullptr ? vocab->vocab_begin() : 0;
  // The pieces cut this rank's rows of the vocabulary.
  for (const int64_t use : {StageLayout::kVocabIn, StageLayout::kVocabOut})
    if (vocab_grads_windowed_ && at_.vocab(use).begin >= 0 && at_.vocab(use).rows != vl_)
      throw std::logic_error("GptStage: the vocabulary's stored rows are not its share");
  // A slot holds one chunk's layers (a chunk that lacks none).
  const int64_t BT = B_ * T_, R = rows_, C = cfg_.n_embd, L = range_.full_chunk();
  // Every allocation is counted: stage_footprint must predict the sum.
  auto act = [&](int64_t count) {
    allocated_ += count * static_cast<int64_t>(sizeof(Act));
    return Buffer<Act>(static_cast<size_t>(count));
  };
  auto acc = [&](int64_t count) {
    allocated_ += count * static_cast<int64_t>(sizeof(Acc));
    return Buffer<Acc>(static_cast<size_t>(count));
  };
  auto attn = [&](int64_t count) {
    allocated_ += count * static_cast<int64_t>(sizeof(AttnState));
    return Buffer<AttnState>(static_cast<size_t>(count));
  };
  const AttentionStorage storage = stage_attention_storage(Ops::kAttention, opt_.cp);
  const int64_t attn_state = attention_state_elements(storage, B_, nh_, T_);
  auto ints = [&](int64_t count) {
    allocated_ += count * static_cast<int64_t>(sizeof(int32_t));
    return Buffer<int32_t>(static_cast<size_t>(count));
  };
  moe_ = moe_plan(cfg_, range_, B_, opt_.cp);
  const int64_t E = cfg_.experts, K = cfg_.top_k, M = moe_.rows, Mr = moe_.received;
  auto tokens = [&](int64_t count) {
    allocated_ += count * static_cast<int64_t>(sizeof(int32_t));
    return typename Ops::Tokens(count);
  };
  const int64_t n = table_.total_storage();
  const int64_t n_grads = resident_grad_offset(n);
  const int64_t n_weights = resident_weight_offset(n);
  grads_ = acc(n_grads);
  Ops::fill_zero(ctx_, grads_.get(), n_grads);
  if (!opt_.external_master) {
    params_ = acc(n);
    Ops::fill_zero(ctx_, params_.get(), n);
  }
  if (std::is_same_v<Act, Acc> && !opt_.external_master) {
    weights_ = reinterpret_cast<Act*>(params_.get());
  } else {
    weight_copy_ = act(n_weights);
    Ops::fill_zero(ctx_, weight_copy_.get(), n_weights);
    weights_ = weight_copy_.get();
  }
  for (int w = 0; w < 2; ++w) {
    if (opt_.window_weights) wwin_[w] = act(at_.block_storage());
    if (opt_.window_grads) gwin_[w] = acc(at_.block_storage());
  }
  // What a block keeps for backward: everything (none), everything but
  // attention's state (attention), or nothing but its input (full).
  const bool means = !cfg_.llama();  // LayerNorm keeps means, RMSNorm none
  // Its MLP's rows: the micro-batch's (dense), the dispatched (sparse), or
  // the more of the two where a slot position serves both.
  auto keep = [&](LayerActs& a, bool probabilities, bool dense, bool sparse) {
    const int64_t mlp_rows = std::max(dense ? BT : 0, sparse ? Mr : 0);
    a.ln1 = act(R * C);
    if (means) a.ln1_mean = acc(R);
    a.ln1_rstd = acc(R);
    a.qkv = act(BT * cqkv_);
    a.atty = act(BT * ca_);
    if (probabilities) a.att = attn(attn_state);
    a.res2 = act(R * C);
    a.ln2 = act(R * C);
    if (means) a.ln2_mean = acc(R);
    a.ln2_rstd = acc(R);
    a.fch = act(mlp_rows * cin_);
    a.fch_gelu = act(mlp_rows * cm_);
    if (!sparse) return;
    a.y = act(M * C);
    a.probs = acc(BT * E);
    a.lse = acc(BT);
    a.gate = acc(BT * K);
    a.expert = ints(BT * K);
    a.dest = ints(BT * K);
    a.chose = ints(B_ * E);
    a.kept = Buffer<int64_t>(static_cast<size_t>(E));
    allocated_ += E * static_cast<int64_t>(sizeof(int64_t));
    a.kept_host.assign(static_cast<size_t>(E), 0);
    if (moe_.ep == 1) return;
    a.xr = act(Mr * C);
    if (opt_.split_backward) a.dyr = act(Mr * C);
    a.counts.assign(static_cast<size_t>(moe_.ep * E), 0);
  };
  bool any_dense = false;
  for (bool d : moe_.dense_at) any_dense = any_dense || d;
  slots_.resize(static_cast<size_t>(opt_.slots.count));
  for (Slot& s : slots_) {
    // A slot that only ever holds the model's short first or last chunk
    // allocates that chunk's positions (the rest stay empty, never used).
    const int k = static_cast<int>(&s - slots_.data());
    const auto [lo, hi] = range_.slot_span(opt_.slots.first_only(k), opt_.slots.last_only(k));
    for (int64_t i = 0; i <= L; ++i)
      s.residual.push_back(i >= lo && i <= hi ? act(R * C) : Buffer<Act>());
    if (opt_.recompute != Recompute::kFull) {
      s.layers.resize(static_cast<size_t>(L));
      for (int64_t j = lo; j < hi; ++j) {
        const size_t u = static_cast<size_t>(j);
        keep(s.layers[u], opt_.recompute == Recompute::kNone, moe_.dense_at[u], moe_.sparse_at[u]);
      }
    }
    if (range_.has_embedding) s.tokens = tokens(BT);
    if (opt_.positions_given()) s.positions = tokens(BT);
    // Split backward, interleaving: the head's buffers once, for every
    // slot (head_of).
    if (range_.has_head && (!shared_head() || &s == &slots_[0])) {
      s.lnf = act(R * C);
      if (means) s.lnf_mean = acc(R);
      s.lnf_rstd = acc(R);
      s.logits = act(BT * vl_);
      s.losses = acc(BT);
      s.targets = tokens(BT);
    }
    if (opt_.split_backward) s.ln_grads = acc(4 * L * C);
  }
  if (L > 0 && opt_.recompute == Recompute::kAttention) rc_.att = attn(attn_state);
  if (L > 0 && opt_.recompute == Recompute::kFull) {
    keep(rc_, true, any_dense, moe_.any_sparse);
    rc_out_ = act(R * C);
  }
  dres_ = act(R * C);
  dln_ = act(BT * C);
  datty_ = act(BT * ca_);
  if (L > 0) {
    dqkv_ = act(BT * cqkv_);
    d4_ = act(BT * cin_);
    if (cfg_.llama()) dact_ = act(BT * cm_);
    if (opt_.cp == 1)
      datt_ = attn(attention_scratch_elements(Ops::kAttention, B_, nh_, T_,
                                              static_cast<int64_t>(cfg_.head_dim())));
  }
  if (L > 0 && cfg_.llama()) {
    // Every position of the sequence (a context rank's tokens are anywhere
    // in it).
    const std::vector<float> table =
        host::rope_table(cfg_.seq_len, cfg_.head_dim(), cfg_.rope_theta);
    rope_ = Buffer<float>(table.size());
    allocated_ += static_cast<int64_t>(table.size() * sizeof(float));
    Ops::upload(ctx_, rope_.get(), table.data(), static_cast<int64_t>(table.size()));
  }
  // The head's input gradient in float where it adds up over pieces.
  if (range_.has_head && grad_pieces(StageLayout::kVocabOut) > 1) head_dx_ = acc(BT * C);
  if (range_.has_head && tp > 1) {
    ce_max_ = acc(BT);
    ce_stats_ = acc(2 * BT);
  }
  // Interleaved, the last stage's earlier chunks receive gradients too.
  if (!range_.has_head || range_.chunks > 1) grad_in_ = act(R * C);
  if (opt_.sequence_parallel) {
    full_ = act(BT * C);
    dln_rows_ = act(R * C);
    ln_grads_ = acc(4 * C);
  }
  if (gathers_embedding()) {
    full_ = act(BT * C);
    row_order_ = tokens(BT);
    row_order_host_.resize(static_cast<size_t>(BT));
    row_counts_.resize(static_cast<size_t>(tp));
    row_starts_.resize(static_cast<size_t>(tp));
  }
  if (moe_.any_sparse) {
    moe_logits_ = act(BT * E);
    moe_lg_ = acc(BT * E);
    moe_dgate_ = acc(BT * K);
    moe_x_ = act(M * C);
    moe_dx_ = act(M * C);
    moe_d4_ = act(Mr * cin_);
    if (cfg_.llama()) moe_dact_ = act(Mr * cm_);
    if (moe_.ep > 1) {
      moe_yr_ = act(Mr * C);
      ep_send_.resize(static_cast<size_t>(moe_.ep));
      ep_recv_.resize(static_cast<size_t>(moe_.ep));
    }
    const size_t scratch = Ops::router_scratch_bytes(moe_.router);
    router_scratch_ = Buffer<char>(scratch);
    allocated_ += static_cast<int64_t>(scratch);
    for (Buffer<double>* t : {&router_totals_, &router_discard_}) {
      *t = Buffer<double>(kRouterTotals);
      allocated_ += kRouterTotals * static_cast<int64_t>(sizeof(double));
      Ops::fill_zero(ctx_, t->get(), kRouterTotals);
    }
    expert_load_.assign(static_cast<size_t>(range_.num_layers() * E), 0.0);
  }
  loss_sum_ = Buffer<double>(1);
  allocated_ += static_cast<int64_t>(sizeof(double));
  Ops::fill_zero(ctx_, loss_sum_.get(), 1);
}

template <class Ops>
void GptStage<Ops>::refresh_weights() {
  // With external_master the trainer writes weights() itself.
  if constexpr (!std::is_same_v<Act, Acc>)
    if (!opt_.external_master) Ops::convert(ctx_, weights_, params_.get(), table_.total_storage());
}

template <class Ops>
void GptStage<Ops>::init_parameters(uint64_t seed) {
  if constexpr (Ops::kHostMemory) {
    fill_initial_parameters(table_, seed, params_.get());
  } else {
    // Drawn on the host (the same values on every device), then uploaded.
    std::vector<Acc> host(static_cast<size_t>(table_.total_storage()));
    fill_initial_parameters(table_, seed, host.data());
    Ops::upload(ctx_, params_.get(), host.data(), table_.total_storage());
  }
  refresh_weights();
}

template <class Ops>
void GptStage<Ops>::zero_grads() {
  Ops::fill_zero(ctx_, grads_.get(), resident_grad_offset(table_.total_storage()));
}

template <class Ops>
void GptStage<Ops>::vocab_weights(int64_t id, int64_t next) {
  if (vocab_weights_windowed_) hooks_.need_weights(id, next);
}

template <class Ops>
void GptStage<Ops>::vocab_grads_before(int64_t id) {
  if (!vocab_grads_windowed_) return;
  take_grad_window(id, at_.piece(id).size());
}

template <class Ops>
void GptStage<Ops>::vocab_grads_after(int64_t id) {
  if (vocab_grads_windowed_) hooks_.grads_ready(id, grad_window_);
}

template <class Ops>
BlockView<const typename Ops::Act> GptStage<Ops>::block_weights(int64_t i) {
  if (opt_.window_weights) return at_.block_at(static_cast<const Act*>(wwin_[i % 2].get()), i);
  return at_.block(static_cast<const Act*>(weights_), i);
}

template <class Ops>
BlockView<typename Ops::Acc> GptStage<Ops>::block_grads(int64_t i) {
  if (opt_.window_grads) return at_.block_at(gwin_[grad_window_].get(), i);
  return at_.block(grads_.get(), i);
}

template <class Ops>
void GptStage<Ops>::forward(int slot, const int32_t* tokens, const int32_t* targets,
                            bool for_backward, Acc grad_scale, int chunk,
                            const int32_t* positions) {
  Slot& s = slots_[slot];
  if (opt_.positions_given() != (positions != nullptr))
    throw std::logic_error(
        "GptStage::forward: positions are given exactly with document_mask or cp > 1");
  use_positions(s);
  const int64_t BT = B_ * T_, C = cfg_.n_embd, L = range_.chunk_layers(chunk);
  const int64_t first = range_.chunk_block(chunk);
  s.grad_scale = grad_scale;
  // Every host-to-device copy first, before any op of this micro-batch is
  // queued, so the device never waits on the host in the middle.
  if (embeds(chunk)) Ops::load_tokens(ctx_, s.tokens, tokens, BT, true);
  Slot& h = head_of(s);
  if (heads(chunk)) Ops::load_tokens(ctx_, h.targets, targets, BT, false);
  // Grouped where the embedding's backward sums wpe's rows by position.
  if (positions != nullptr)
    Ops::load_tokens(ctx_, s.positions, positions, BT, embeds(chunk) && !cfg_.llama());
  if (embeds(chunk)) {
    published(StageLayout::kVocabIn);
    embed(s, tokens);
  }
  for (int64_t i = first; i < first + L; ++i) {
    published(i);
    if (opt_.window_weights) hooks_.need_weights(i, i + 1 < first + L ? i + 1 : -1);
    const int64_t j = in_slot(i);
    // Under full recomputation the block's activations go to the shared
    // buffers and only its input (the residual stream) is kept.
    LayerActs& a = opt_.recompute == Recompute::kFull ? rc_ : s.layers[j];
    forward_block(a, s.residual[j].get(), s.residual[j + 1].get(), i);
  }
  if (!heads(chunk)) return;
  published(StageLayout::kVocabOut);
  norm_forward(h.lnf.get(), h.lnf_mean.get(), h.lnf_rstd.get(), stream_end(s),
               w_outer(outer::lnf_w), w_outer(outer::lnf_b), rows_);
  // Piece by piece, each into its columns of the logits.
  const Act* lnf = gathered(h.lnf.get());
  const int64_t n = weight_pieces(StageLayout::kVocabOut);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = StageLayout::piece_id(StageLayout::kVocabOut, k);
    vocab_weights(id, k + 1 < n ? StageLayout::piece_id(StageLayout::kVocabOut, k + 1) : -1);
    const auto [r0, rows] = piece_rows(StageLayout::kVocabOut, k, n);
    Ops::matmul_forward(ctx_, h.logits.get() + r0, lnf, w_vocab(id),
                        static_cast<const Act*>(nullptr), BT, C, rows, vl_);
  }
  head_loss(h, for_backward, grad_scale);
  Ops::accumulate_sum(ctx_, loss_sum_.get(), h.losses.get(), BT);
}

template <class Ops>
void GptStage<Ops>::embed(Slot& s, const int32_t* tokens) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd;
  // The vocabulary's pieces one after another (one, unless it goes
  // through the windows): each writes the rows of its tokens only.
  const int64_t in_pieces = weight_pieces(StageLayout::kVocabIn);
  const auto piece = [&](int64_t k) {
    const int64_t id = StageLayout::piece_id(StageLayout::kVocabIn, k);
    vocab_weights(id, k + 1 < in_pieces ? StageLayout::piece_id(StageLayout::kVocabIn, k + 1) : -1);
    return id;
  };
  if (!gathers_embedding()) {
    // Vocabulary-parallel under sequence parallelism: each rank embeds the
    // tokens of its vocabulary rows (zeros elsewhere), the group's sum,
    // scattered, is the embedding (one rank: the embedding itself).
    Act* partial = sum_target(embedded(s));
    for (int64_t k = 0; k < in_pieces; ++k) {
      const int64_t id = piece(k);
      const auto [r0, rows] = piece_rows(StageLayout::kVocabIn, k, in_pieces);
      Ops::embedding_forward(ctx_, partial, s.tokens, w_vocab(id), w_outer(outer::wpe), B_, T_, C,
                             v0_ + r0, rows, positions_, k > 0);
    }
    summed(partial, embedded(s));
    return;
  }
  // Every position's row is computed by the one rank holding its token:
  // order the positions by that rank (increasing within it), each rank
  // computes its run of them, the group gathers the runs and each rank
  // moves every row to its position. The bits are the holding rank's, as
  // the sum with exact zeros gave, with no zero rows sent.
  const int64_t tp = range_.tp;
  // The data reader refuses tokens outside the vocabulary.
  const auto holder = [&](int64_t bt) {
    const int64_t r = tokens[bt] / vl_;
    if (tokens[bt] < 0 || r >= tp) throw std::logic_error("embed: a token outside the vocabulary");
    return static_cast<size_t>(r);
  };
  std::fill(row_counts_.begin(), row_counts_.end(), 0);
  for (int64_t bt = 0; bt < BT; ++bt) ++row_counts_[holder(bt)];
  std::vector<int64_t>& at = row_starts_;  // each rank's next place in the order
  at[0] = 0;
  for (int64_t r = 1; r < tp; ++r) at[r] = at[r - 1] + row_counts_[r - 1];
  const int64_t first = at[static_cast<size_t>(range_.tp_rank)];
  for (int64_t bt = 0; bt < BT; ++bt)
    row_order_host_[static_cast<size_t>(at[holder(bt)]++)] = static_cast<int32_t>(bt);
  Ops::load_tokens(ctx_, row_order_, row_order_host_.data(), BT, false);
  const int64_t mine = row_counts_[static_cast<size_t>(range_.tp_rank)];
  Act* whole = full_.get();
  for (int64_t k = 0; k < in_pieces; ++k) {
    const int64_t id = piece(k);
    const auto [r0, rows] = piece_rows(StageLayout::kVocabIn, k, in_pieces);
    Ops::embedding_forward_rows(ctx_, whole + first * C, s.tokens, row_order_, first, mine,
                                w_vocab(id), w_outer(outer::wpe), T_, C, v0_ + r0, positions_,
                                rows);
  }
  for (int64_t& n : row_counts_) n *= C;  // elements, as the gather counts them
  tp_.gather_parts(whole + first * C, whole, row_counts_, Ops::kActElement);
  Ops::scatter_rows(ctx_, embedded(s), whole, row_order_, BT, C);
}

template <class Ops>
void GptStage<Ops>::head_loss(Slot& s, bool for_backward, Acc grad_scale) {
  const int64_t BT = B_ * T_;
  if (range_.tp == 1) {
    if (for_backward) {
      Ops::crossentropy_forward_backward(ctx_, s.losses.get(), s.logits.get(), s.targets, BT,
                                         cfg_.vocab_size, vl_, grad_scale);
    } else {
      Ops::crossentropy_forward(ctx_, s.losses.get(), s.logits.get(), s.targets, BT,
                                cfg_.vocab_size, vl_);
    }
    return;
  }
  // Vocabulary-parallel: only per-row statistics cross the group, never the
  // logits.
  Ops::crossentropy_vp_max(ctx_, ce_max_.get(), s.logits.get(), BT, v_real_, vl_);
  tp_.max(ce_max_.get(), BT, element<Acc>());
  Ops::crossentropy_vp_sums(ctx_, ce_stats_.get(), s.logits.get(), s.targets, ce_max_.get(), BT,
                            v_real_, vl_, v0_);
  tp_sum(ce_stats_.get(), 2 * BT);
  Ops::crossentropy_vp_finish(ctx_, s.losses.get(), s.logits.get(), s.targets, ce_max_.get(),
                              ce_stats_.get(), BT, v_real_, vl_, v0_, grad_scale, for_backward);
}

template <class Ops>
void GptStage<Ops>::forward_block(LayerActs& a, const Act* x, Act* out, int64_t i,
                                  bool recomputing) {
  const int64_t BT = B_ * T_, R = rows_, C = cfg_.n_embd;
  const auto w = block_weights(i);
  // The row-parallel projections' outputs are partial sums until the group
  // adds them; their bias (replicated) is added once, by tensor rank 0.
  const bool adds_bias = range_.tp_rank == 0;
  norm_forward(a.ln1.get(), a.ln1_mean.get(), a.ln1_rstd.get(), x, w[block::ln1_w],
               w[block::ln1_b], R);
  Ops::matmul_forward(ctx_, a.qkv.get(), gathered(a.ln1.get()), w[block::qkv_w], w[block::qkv_b],
                      BT, C, cqkv_);
  rotate(a.qkv.get(), 1.f);
  attend(a, attention_state(a));
  Act* proj = sum_target(a.res2.get());
  Ops::matmul_forward(ctx_, proj, a.atty.get(), w[block::attn_proj_w],
                      adds_bias ? w[block::attn_proj_b] : nullptr, BT, ca_, C);
  summed(proj, a.res2.get());
  Ops::residual_forward(ctx_, a.res2.get(), x, a.res2.get(), R * C);
  norm_forward(a.ln2.get(), a.ln2_mean.get(), a.ln2_rstd.get(), a.res2.get(), w[block::ln2_w],
               w[block::ln2_b], R);
  Act* mlp = sum_target(out);
  if (sparse(i)) {
    moe_forward(a, mlp, w, i, !recomputing);
  } else {
    Ops::matmul_forward(ctx_, a.fch.get(), gathered(a.ln2.get()), w[block::fc_w], w[block::fc_b],
                        BT, C, cin_);
    activation_forward(a.fch_gelu.get(), a.fch.get());
    Ops::matmul_forward(ctx_, mlp, a.fch_gelu.get(), w[block::fc_proj_w],
                        adds_bias ? w[block::fc_proj_b] : nullptr, BT, cm_, C);
  }
  summed(mlp, out);
  Ops::residual_forward(ctx_, out, a.res2.get(), out, R * C);
}

template <class Ops>
const typename Ops::Act* GptStage<Ops>::gathered(const Act* rows) {
  if (!opt_.sequence_parallel) return rows;
  tp_.gather(rows, full_.get(), rows_ * cfg_.n_embd, Ops::kActElement);
  return full_.get();
}

template <class Ops>
void GptStage<Ops>::summed(const Act* partial, Act* rows) {
  if (opt_.sequence_parallel) tp_.scatter_sum(partial, rows, rows_ * cfg_.n_embd, Ops::kActElement);
  else tp_sum(rows, rows_ * cfg_.n_embd);
}

template <class Ops>
std::function<typename Ops::Act*()> GptStage<Ops>::start_input_grad_sum() {
  Act* whole = dln_.get();
  if (range_.tp == 1) return [whole] { return whole; };
  if (!opt_.sequence_parallel) {
    auto wait = tp_.start_sum(whole, rows_ * cfg_.n_embd, Ops::kActElement);
    return [wait, whole] {
      wait();
      return whole;
    };
  }
  Act* mine = dln_rows_.get();
  auto wait = tp_.start_scatter_sum(whole, mine, rows_ * cfg_.n_embd, Ops::kActElement);
  return [wait, mine] {
    wait();
    return mine;
  };
}

template <class Ops>
typename Ops::Act* GptStage<Ops>::column_parallel_backward(Acc* dw, Acc* db, const Act* dout,
                                                           const Act* inp, const Act* w,
                                                           int64_t OC) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd;
  Ops::matmul_backward(ctx_, dln_.get(), static_cast<Acc*>(nullptr), static_cast<Acc*>(nullptr),
                       dout, inp, w, BT, C, OC);
  const auto sum_ready = start_input_grad_sum();
  if (dw != nullptr)
    Ops::matmul_backward(ctx_, static_cast<Act*>(nullptr), dw, db, dout, inp, w, BT, C, OC);
  return sum_ready();
}

template <class Ops>
const typename Ops::Act* GptStage<Ops>::head_backward(Slot& h) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, n = grad_pieces(StageLayout::kVocabOut);
  const Act* lnf = gathered(h.lnf.get());
  const auto id = [](int64_t k) { return StageLayout::piece_id(StageLayout::kVocabOut, k); };
  if (n == 1) {
    vocab_weights(id(0));
    vocab_grads_before(id(0));
    const Act* dln = column_parallel_backward(g_head(), static_cast<Acc*>(nullptr), h.logits.get(),
                                              lnf, w_vocab(id(0)), vl_);
    vocab_grads_after(id(0));
    return dln;
  }
  // From the last piece, which the forward left in its window. The input
  // gradient adds up over the pieces in float (head_dx_), rounded once:
  // the sum over the vocabulary split in n, not in one product (not the
  // bits of one piece: StageMemoryOptions.TheVocabularyInPiecesMatchesItWhole
  // states the tolerance).
  for (int64_t k = n - 1; k >= 0; --k) {
    vocab_weights(id(k), k > 0 ? id(k - 1) : -1);
    vocab_grads_before(id(k));
    const auto [r0, rows] = piece_rows(StageLayout::kVocabOut, k, n);
    const Act* dlogits = h.logits.get() + r0;
    Ops::matmul_input_grad(ctx_, head_dx_.get(), k + 1 < n, dlogits, w_vocab(id(k)), BT, C, rows,
                           vl_);
    Ops::matmul_backward(ctx_, static_cast<Act*>(nullptr), g_head(), static_cast<Acc*>(nullptr),
                         dlogits, lnf, w_vocab(id(k)), BT, C, rows, vl_);
    vocab_grads_after(id(k));
  }
  Ops::convert(ctx_, dln_.get(), static_cast<const Acc*>(head_dx_.get()), BT * C);
  return start_input_grad_sum()();
}

template <class Ops>
void GptStage<Ops>::embedding_backward(const Act* dout, const Slot& s) {
  // Every rank's vocabulary rows may appear anywhere in the micro-batch:
  // each piece reads the whole gradient. The positions' gradient once.
  const int64_t C = cfg_.n_embd;
  const int64_t n = grad_pieces(StageLayout::kVocabIn);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = StageLayout::piece_id(StageLayout::kVocabIn, k);
    vocab_grads_before(id);
    const auto [r0, rows] = piece_rows(StageLayout::kVocabIn, k, n);
    Ops::embedding_backward(ctx_, g_outer(outer::wte), k == 0 ? g_outer(outer::wpe) : nullptr, dout,
                            s.tokens, B_, T_, C, v0_ + r0, rows, positions_);
    vocab_grads_after(id);
  }
}

template <class Ops>
typename Ops::Acc* GptStage<Ops>::ln_stash(Slot& s, int64_t i) {
  if (split() && i >= 0) return s.ln_grads.get() + 4 * cfg_.n_embd * in_slot(i);
  return opt_.sequence_parallel ? ln_grads_.get() : nullptr;
}

template <class Ops>
void GptStage<Ops>::add_ln_grads(Acc* stash, std::initializer_list<Acc*> grads) {
  if (stash == nullptr) return;
  const int64_t C = cfg_.n_embd, n = static_cast<int64_t>(grads.size()) * C;
  if (opt_.sequence_parallel) tp_sum(stash, n);
  int64_t at = 0;
  for (Acc* g : grads) {
    if (g != nullptr) Ops::add_into(ctx_, g, stash + at, C);  // RMSNorm: no bias
    at += C;
  }
}

template <class Ops>
void GptStage<Ops>::backward(int slot, const GradsFinal& grads_final, int chunk) {
  auto final_from = [&](int64_t offset) {
    if (grads_final) grads_final(offset);
  };
  Slot& s = slots_[slot];
  use_positions(s);
  const int64_t R = rows_, C = cfg_.n_embd, L = range_.chunk_layers(chunk);
  const int64_t first = range_.chunk_block(chunk);
  // Split (B): no weight gradient here, so no gradient is final and no
  // gradient window is needed; the GEMMs' inputs need not be gathered.
  const bool whole = !split();
  Act* dres = dres_.get();
  if (heads(chunk)) {
    // The tied head: its weight gradient lands in wte's gradient, which the
    // embedding backward then adds to. Vocabulary-parallel, each rank's
    // input gradient covers its columns only: the group sums them.
    // Split, the head's weight gradients too: they read dlogits, which
    // the next forward overwrites (one buffer for every slot), and they
    // are final only at W's end (with wte's, whose gradient this is).
    Slot& h = head_of(s);
    const Act* dln = head_backward(h);
    Ops::fill_zero(ctx_, dres, R * C);
    Acc* stash = ln_stash(s, -1);
    if (stash) Ops::fill_zero(ctx_, stash, 2 * C);
    norm_backward(dres, ln_grad(stash, g_outer(outer::lnf_w), 0),
                  ln_grad(stash, g_outer(outer::lnf_b), 1), dln, stream_end(s),
                  w_outer(outer::lnf_w), h.lnf_mean.get(), h.lnf_rstd.get(), R);
    add_ln_grads(stash, {g_outer(outer::lnf_w), g_outer(outer::lnf_b)});
    if (whole) final_from(at_.at(outer::lnf_w));
  } else {
    Ops::copy(ctx_, dres, static_cast<const Act*>(grad_in_.get()), R * C);
  }
  // Later chunks (higher offsets) finished their backwards before this
  // chunk's last one (the schedule runs the last micro-batch's chunks from
  // the last down), so "final from here" holds across chunks too.
  for (int64_t i = first + L - 1; i >= first; --i) {
    if (opt_.window_weights) hooks_.need_weights(i, i > first ? i - 1 : -1);
    if (whole && opt_.window_grads) take_grad_window(i, at_.block_storage());
    backward_block(s, i);
    if (whole && opt_.window_grads) hooks_.grads_ready(i, grad_window_);
    if (whole) final_from(at_.layers[i][0]);
  }
  if (!whole) {
    // The embedding's backward is W's, from the stage's input, which block
    // 0's backward has finished reading.
    if (embeds(chunk)) Ops::copy(ctx_, embedded(s), static_cast<const Act*>(dres), R * C);
    return;
  }
  if (chunk > 0) return;  // the tensors before chunk 0's blocks are chunk 0's
  if (range_.has_embedding) embedding_backward(gathered(dres), s);
  final_from(0);
}

template <class Ops>
void GptStage<Ops>::weight_gradients(int slot, const GradsFinal& grads_final, int chunk) {
  if (!split()) throw std::logic_error("weight_gradients without split backward");
  auto final_from = [&](int64_t offset) {
    if (grads_final) grads_final(offset);
  };
  Slot& s = slots_[slot];
  use_positions(s);
  const int64_t L = range_.chunk_layers(chunk);
  const int64_t first = range_.chunk_block(chunk);
  if (heads(chunk)) final_from(at_.at(outer::lnf_w));  // B computed the head's
  for (int64_t i = first + L - 1; i >= first; --i) {
    if (opt_.window_grads) take_grad_window(i, at_.block_storage());
    weight_gradients_block(s, i);
    if (opt_.window_grads) hooks_.grads_ready(i, grad_window_);
    final_from(at_.layers[i][0]);
  }
  if (chunk > 0) return;
  if (range_.has_embedding) embedding_backward(gathered(embedded(s)), s);
  final_from(0);
}

template <class Ops>
void GptStage<Ops>::weight_gradients_block(Slot& s, int64_t i) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd;
  const auto g = block_grads(i);
  const int64_t j = in_slot(i);
  LayerActs& a = s.layers[j];
  const Act* none = nullptr;  // W reads no weights (ZeRO 3 gathers none)
  const auto dw = [&](block::Tensor w, block::Tensor b, const Act* dout, const Act* inp, int64_t in,
                      int64_t out) {
    Ops::matmul_backward(ctx_, static_cast<Act*>(nullptr), g[w], g[b], dout, inp, none, BT, in, out);
  };
  // Each GEMM's output gradient where backward_block left it (gpt_stage.hpp).
  if (sparse(i)) {
    moe_weight_gradients(a, g);
  } else {
    dw(block::fc_proj_w, block::fc_proj_b, gathered(s.residual[j + 1].get()), a.fch_gelu.get(), cm_, C);
    dw(block::fc_w, block::fc_b, a.fch.get(), gathered(a.ln2.get()), C, cin_);
  }
  dw(block::attn_proj_w, block::attn_proj_b, gathered(a.res2.get()), a.atty.get(), ca_, C);
  dw(block::qkv_w, block::qkv_b, a.qkv.get(), gathered(a.ln1.get()), C, cqkv_);
  add_ln_grads(ln_stash(s, i), {g[block::ln2_w], g[block::ln2_b], g[block::ln1_w], g[block::ln1_b]});
}

template <class Ops>
void GptStage<Ops>::backward_block(Slot& s, int64_t i) {
  const int64_t BT = B_ * T_, R = rows_, C = cfg_.n_embd;
  const auto w = block_weights(i);
  const auto g = block_grads(i);
  const int64_t j = in_slot(i);
  // Full recomputation: the block's forward again, from its kept input,
  // into the shared buffers (the same ops on the same inputs, so the same
  // bits); its output is not needed again.
  if (opt_.recompute == Recompute::kFull)
    forward_block(rc_, s.residual[j].get(), rc_out_.get(), i, true);
  LayerActs& a = opt_.recompute == Recompute::kFull ? rc_ : s.layers[j];
  Act* dres = dres_.get();
  // MLP: dres is the gradient of the block output, which is also the
  // gradient of the MLP projection's output (residual backward = identity).
  // Under tensor parallelism dres is the same on every rank of the group,
  // so the replicated parameters (LayerNorms, the projections' biases) get
  // the same gradients everywhere; the column-parallel layers' input
  // gradients are partial sums until the group adds them. Under sequence
  // parallelism the row-parallel GEMMs read the gathered dres (so the
  // projections' bias gradients are still whole on every rank), and the
  // LayerNorms' weight gradients, from this rank's rows, are summed over
  // the group (ln_grad, add_ln_grads).
  //
  // Split (B): the weight-gradient halves are W's (weight_gradients_block),
  // each GEMM's output gradient kept where the rest of this backward no
  // longer reads: the block's output gradient in its output (read only by
  // the next block's backward, done), fc's in its pre-activation fch
  // (GELU's backward reads it last), attn_proj's in res2 (read last by
  // ln2's backward), qkv's in qkv (read last by attention's backward).
  const bool whole = !split();
  auto wgt = [&](block::Tensor t) { return whole ? g[t] : nullptr; };
  Acc* stash = ln_stash(s, i);
  if (stash) Ops::fill_zero(ctx_, stash, 4 * C);
  if (!whole) Ops::copy(ctx_, s.residual[j + 1].get(), static_cast<const Act*>(dres), R * C);
  // The activation's gradient: in d4_ itself (GELU, elementwise in place),
  // or in dact_ (SwiGLU's output is half as wide as its input).
  const Act* dln2 = nullptr;
  if (sparse(i)) {
    dln2 = moe_backward(a, dres, w, g, s.grad_scale);
  } else {
    Act* dact = cfg_.llama() ? dact_.get() : d4_.get();
    Ops::matmul_backward(ctx_, dact, wgt(block::fc_proj_w), wgt(block::fc_proj_b),
                         gathered(dres), a.fch_gelu.get(), w[block::fc_proj_w], BT, cm_, C);
    Act* d4 = whole ? d4_.get() : a.fch.get();
    activation_backward(d4, a.fch.get(), dact);
    dln2 = column_parallel_backward(wgt(block::fc_w), wgt(block::fc_b), d4,
                                    whole ? gathered(a.ln2.get()) : nullptr, w[block::fc_w], cin_);
  }
  norm_backward(dres, ln_grad(stash, g[block::ln2_w], 0), ln_grad(stash, g[block::ln2_b], 1), dln2,
                a.res2.get(), w[block::ln2_w], a.ln2_mean.get(), a.ln2_rstd.get(), R);
  if (!whole) Ops::copy(ctx_, a.res2.get(), static_cast<const Act*>(dres), R * C);
  // Attention, the same way round.
  Ops::matmul_backward(ctx_, datty_.get(), wgt(block::attn_proj_w), wgt(block::attn_proj_b),
                       gathered(dres), a.atty.get(), w[block::attn_proj_w], BT, ca_, C);
  // Attention recomputation: its state again from the kept qkv. The
  // forward also rewrites atty, with the bits it already holds.
  if (opt_.recompute == Recompute::kAttention) attend(a, rc_.att.get());
  attend_backward(a, attention_state(a));
  // The gradient of the projection's output: through the rotation back.
  rotate(dqkv_.get(), -1.f);
  if (!whole) Ops::copy(ctx_, a.qkv.get(), static_cast<const Act*>(dqkv_.get()), BT * cqkv_);
  const Act* dln1 = column_parallel_backward(wgt(block::qkv_w), wgt(block::qkv_b), dqkv_.get(),
                                             whole ? gathered(a.ln1.get()) : nullptr,
                                             w[block::qkv_w], cqkv_);
  norm_backward(dres, ln_grad(stash, g[block::ln1_w], 2), ln_grad(stash, g[block::ln1_b], 3), dln1,
                s.residual[j].get(), w[block::ln1_w], a.ln1_mean.get(), a.ln1_rstd.get(), R);
  if (whole) add_ln_grads(stash, {g[block::ln2_w], g[block::ln2_b], g[block::ln1_w], g[block::ln1_b]});
}

template <class Ops>
void GptStage<Ops>::norm_forward(Act* out, Acc* mean, Acc* rstd, const Act* x, const Act* w,
                                 const Act* b, int64_t N) {
  if (cfg_.llama()) Ops::rmsnorm_forward(ctx_, out, rstd, x, w, N, cfg_.n_embd, cfg_.norm_eps);
  else Ops::layernorm_forward(ctx_, out, mean, rstd, x, w, b, N, cfg_.n_embd);
}

template <class Ops>
void GptStage<Ops>::norm_backward(Act* dinp, Acc* dw, Acc* db, const Act* dout, const Act* x,
                                  const Act* w, const Acc* mean, const Acc* rstd, int64_t N) {
  if (cfg_.llama()) Ops::rmsnorm_backward(ctx_, dinp, dw, dout, x, w, rstd, N, cfg_.n_embd);
  else Ops::layernorm_backward(ctx_, dinp, dw, db, dout, x, w, mean, rstd, N, cfg_.n_embd);
}

template <class Ops>
void GptStage<Ops>::activation_forward(Act* out, const Act* inp, int64_t rows) {
  const int64_t N = rows < 0 ? B_ * T_ : rows;
  if (N == 0) return;
  if (cfg_.llama()) Ops::swiglu_forward(ctx_, out, inp, N, cm_);
  else Ops::gelu_forward(ctx_, out, inp, N * cm_);
}

template <class Ops>
void GptStage<Ops>::activation_backward(Act* dinp, const Act* inp, const Act* dout, int64_t rows) {
  const int64_t N = rows < 0 ? B_ * T_ : rows;
  if (N == 0) return;
  if (cfg_.llama()) Ops::swiglu_backward(ctx_, dinp, inp, dout, N, cm_);
  else Ops::gelu_backward(ctx_, dinp, inp, dout, N * cm_);
}

template <class Ops>
void GptStage<Ops>::moe_forward(LayerActs& a, Act* mlp, const BlockView<const Act>& w, int64_t i,
                                bool counted) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, E = cfg_.experts, K = cfg_.top_k;
  // The router, replicated on the tensor group, reads every row (gathered
  // under sequence parallelism), so every rank routes alike.
  const Act* xn = gathered(a.ln2.get());
  Ops::matmul_forward(ctx_, moe_logits_.get(), xn, w[block::router_w], static_cast<const Act*>(nullptr),
                      BT, C, E);
  Ops::widen(ctx_, moe_lg_.get(), moe_logits_.get(), BT * E);
  Ops::router_forward(ctx_, moe_.router, moe_lg_.get(), a.probs.get(), a.lse.get(), a.expert.get(),
                      a.gate.get(), a.dest.get(), a.chose.get(), a.kept.get(),
                      counted ? router_totals_.get() : router_discard_.get(), router_scratch_.get(),
                      opt_.cp > 1 ? &cp_.router : nullptr);
  // The experts' GEMMs are sized on the host: the one wait of the layer
  // (and, over an expert-parallel group, every rank's counts gathered).
  Ops::download(ctx_, a.kept_host.data(), a.kept.get(), E);
  if (counted)
    for (int64_t e = 0; e < E; ++e)
      expert_load_[static_cast<size_t>(i * E + e)] += static_cast<double>(a.kept_host[static_cast<size_t>(e)]);
  Ops::moe_dispatch_forward(ctx_, moe_x_.get(), xn, a.dest.get(), BT, K, C);
  // The experts' rows: this rank's tokens' (ep 1), or every rank's for the
  // experts this rank holds, sent there and their outputs sent back.
  const Act* rows = moe_x_.get();
  Act* out = a.y.get();
  if (moe_.ep > 1) {
    ep_.allgather(a.kept_host.data(), a.counts.data(), E);
    expert_exchange(a, moe_x_.get(), a.xr.get(), true);
    rows = a.xr.get();
    out = moe_yr_.get();
  }
  // Each expert's MLP on its contiguous rows: column-parallel fc, the
  // activation on every row at once, row-parallel projection (partial sums
  // where tp > 1, its bias added by tensor rank 0), as the dense MLP.
  const bool adds_bias = range_.tp_rank == 0;
  const int64_t n_rows = for_expert_blocks(a, [&](int64_t e, int64_t at, int64_t n) {
    Ops::matmul_forward(ctx_, a.fch.get() + at * cin_, rows + at * C, w.expert(block::fc_w, e),
                        w.expert(block::fc_b, e), n, C, cin_);
  });
  activation_forward(a.fch_gelu.get(), a.fch.get(), n_rows);
  for_expert_blocks(a, [&](int64_t e, int64_t at, int64_t n) {
    Ops::matmul_forward(ctx_, out + at * C, a.fch_gelu.get() + at * cm_,
                        w.expert(block::fc_proj_w, e),
                        adds_bias ? w.expert(block::fc_proj_b, e) : nullptr, n, cm_, C);
  });
  if (moe_.ep > 1) expert_exchange(a, moe_yr_.get(), a.y.get(), false);
  Ops::moe_combine_forward(ctx_, mlp, a.y.get(), a.gate.get(), a.dest.get(), BT, K, C);
}

template <class Ops>
template <class F>
int64_t GptStage<Ops>::for_expert_blocks(const LayerActs& a, F f) const {
  const int64_t E = cfg_.experts, EL = moe_.local_experts, e0 = range_.ep_rank * EL;
  int64_t at = 0;
  for (int64_t s = 0; s < moe_.ep; ++s)
    for (int64_t j = 0; j < EL; ++j) {
      const int64_t n = moe_.ep > 1 ? a.counts[static_cast<size_t>(s * E + e0 + j)]
                                    : a.kept_host[static_cast<size_t>(j)];
      if (n > 0) f(j, at, n);
      at += n;
    }
  return at;
}

template <class Ops>
void GptStage<Ops>::expert_exchange(const LayerActs& a, const Act* from, Act* to, bool to_experts) {
  const int64_t E = cfg_.experts, EL = moe_.local_experts, e0 = range_.ep_rank * EL;
  const int64_t row = cfg_.n_embd * static_cast<int64_t>(sizeof(Act));
  for (int64_t r = 0; r < moe_.ep; ++r) {
    int64_t mine = 0, theirs = 0;
    for (int64_t j = 0; j < EL; ++j) {
      mine += a.kept_host[static_cast<size_t>(r * EL + j)];
      theirs += a.counts[static_cast<size_t>(r * E + e0 + j)];
    }
    ep_send_[static_cast<size_t>(r)] = mine * row;
    ep_recv_[static_cast<size_t>(r)] = theirs * row;
  }
  if (to_experts) ep_.alltoallv(from, ep_send_, to, ep_recv_);
  else ep_.alltoallv(from, ep_recv_, to, ep_send_);
}

template <class Ops>
const typename Ops::Act* GptStage<Ops>::moe_backward(LayerActs& a, const Act* dres,
                                                     const BlockView<const Act>& w,
                                                     const BlockView<Acc>& g, Acc grad_scale) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, E = cfg_.experts, K = cfg_.top_k;
  // Split (B): no weight gradient; what W reads is kept where B no longer
  // reads: the logits' gradient in probs, the experts' output gradients
  // in y (under expert parallelism the rows received, in dyr: W exchanges
  // nothing), their hidden gradients in fch (moe_weight_gradients).
  const bool whole = !split();
  // The combine's: each kept row's output gradient (its gate times the
  // token's) and each gate's, whose dot product reads the experts' outputs:
  // partial sums over the tensor group, so the gates' gradients are summed.
  Ops::moe_combine_backward(ctx_, moe_dx_.get(), moe_dgate_.get(), gathered(dres), a.y.get(),
                            a.gate.get(), a.dest.get(), BT, K, C);
  tp_sum(moe_dgate_.get(), BT * K);
  // The router's logits' gradient, with the aux and z losses' (their
  // weights in the loss this backward's scale divides: the aux loss is a
  // mean over sequences of seq_len tokens, whole under context
  // parallelism too; the z loss over tokens).
  const Acc aux_scale =
      static_cast<Acc>(cfg_.aux_loss * static_cast<double>(cfg_.seq_len) * grad_scale);
  const Acc z_scale = static_cast<Acc>(cfg_.router_z_loss * grad_scale);
  Ops::router_backward(ctx_, moe_.router, moe_lg_.get(), moe_dgate_.get(), a.probs.get(),
                       a.lse.get(), a.expert.get(), a.gate.get(), a.chose.get(), aux_scale, z_scale);
  if (!whole) Ops::copy(ctx_, a.probs.get(), static_cast<const Acc*>(moe_lg_.get()), BT * E);
  Ops::convert(ctx_, moe_logits_.get(), moe_lg_.get(), BT * E);
  // The output gradients to the experts' ranks (expert parallelism), the
  // experts' projections, then their activation on every row at once.
  Act* dy = moe_dx_.get();
  if (moe_.ep > 1) {
    expert_exchange(a, moe_dx_.get(), moe_yr_.get(), true);
    dy = moe_yr_.get();
  }
  Act* dact = cfg_.llama() ? moe_dact_.get() : moe_d4_.get();
  const int64_t n_rows = for_expert_blocks(a, [&](int64_t e, int64_t at, int64_t n) {
    Ops::matmul_backward(ctx_, dact + at * cm_, whole ? g.expert(block::fc_proj_w, e) : nullptr,
                         whole ? g.expert(block::fc_proj_b, e) : nullptr, dy + at * C,
                         a.fch_gelu.get() + at * cm_, w.expert(block::fc_proj_w, e), n, cm_, C);
  });
  if (!whole)
    Ops::copy(ctx_, moe_.ep > 1 ? a.dyr.get() : a.y.get(), static_cast<const Act*>(dy), n_rows * C);
  Act* d4 = whole ? moe_d4_.get() : a.fch.get();
  activation_backward(d4, a.fch.get(), dact, n_rows);
  // ln2's output gradient: the router's (from tensor rank 0 only, the
  // group then sums it), then every kept copy's through its expert's fc
  // (partial over the group) dispatched back to its token. The weight
  // gradients read the experts' input rows: kept (expert parallelism), or
  // ln2's rows dispatched again.
  const Act* xn = whole ? gathered(a.ln2.get()) : nullptr;
  Act* dln = dln_.get();
  if (range_.tp_rank == 0 || whole)
    Ops::matmul_backward(ctx_, range_.tp_rank == 0 ? dln : nullptr,
                         whole ? g[block::router_w] : nullptr, static_cast<Acc*>(nullptr),
                         moe_logits_.get(), xn, w[block::router_w], BT, C, E);
  if (range_.tp_rank != 0) Ops::fill_zero(ctx_, dln, BT * C);
  const Act* rows = moe_.ep > 1 ? a.xr.get() : moe_x_.get();
  if (whole && moe_.ep == 1) Ops::moe_dispatch_forward(ctx_, moe_x_.get(), xn, a.dest.get(), BT, K, C);
  // The input gradients where the output gradients were (read by now).
  for_expert_blocks(a, [&](int64_t e, int64_t at, int64_t n) {
    Ops::matmul_backward(ctx_, dy + at * C, whole ? g.expert(block::fc_w, e) : nullptr,
                         whole ? g.expert(block::fc_b, e) : nullptr, d4 + at * cin_,
                         whole ? rows + at * C : nullptr, w.expert(block::fc_w, e), n, C, cin_);
  });
  if (moe_.ep > 1) expert_exchange(a, moe_yr_.get(), moe_dx_.get(), false);
  Ops::moe_dispatch_backward(ctx_, dln, moe_dx_.get(), a.dest.get(), BT, K, C);
  return start_input_grad_sum()();
}

template <class Ops>
void GptStage<Ops>::moe_weight_gradients(LayerActs& a, const BlockView<Acc>& g) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, E = cfg_.experts, K = cfg_.top_k;
  const Act* none = nullptr;  // W reads no weights (ZeRO 3 gathers none)
  const Act* xn = gathered(a.ln2.get());
  Ops::convert(ctx_, moe_logits_.get(), a.probs.get(), BT * E);  // the logits' gradient, B's
  Ops::matmul_backward(ctx_, static_cast<Act*>(nullptr), g[block::router_w],
                       static_cast<Acc*>(nullptr), moe_logits_.get(), xn, none, BT, C, E);
  // The experts' rows and their output gradients: this rank's tokens'
  // dispatched again (ep 1), or the rows its experts received and their
  // gradients, both kept.
  const Act* rows = moe_x_.get();
  const Act* dy = a.y.get();
  if (moe_.ep > 1) {
    rows = a.xr.get();
    dy = a.dyr.get();
  } else {
    Ops::moe_dispatch_forward(ctx_, moe_x_.get(), xn, a.dest.get(), BT, K, C);
  }
  for_expert_blocks(a, [&](int64_t e, int64_t at, int64_t n) {
    Ops::matmul_backward(ctx_, static_cast<Act*>(nullptr), g.expert(block::fc_proj_w, e),
                         g.expert(block::fc_proj_b, e), dy + at * C,
                         a.fch_gelu.get() + at * cm_, none, n, cm_, C);
    Ops::matmul_backward(ctx_, static_cast<Act*>(nullptr), g.expert(block::fc_w, e),
                         g.expert(block::fc_b, e), a.fch.get() + at * cin_, rows + at * C,
                         none, n, C, cin_);
  });
}

template <class Ops>
void GptStage<Ops>::take_router_stats(double* totals, double* load) {
  if (!moe_.any_sparse) return;
  double t[kRouterTotals];
  Ops::download(ctx_, t, router_totals_.get(), kRouterTotals);
  Ops::fill_zero(ctx_, router_totals_.get(), kRouterTotals);
  for (int k = 0; k < kRouterTotals; ++k) totals[k] += t[k];
  const int64_t E = cfg_.experts;
  for (int64_t i = 0; i < range_.num_layers(); ++i)
    for (int64_t e = 0; e < E; ++e) {
      double& n = expert_load_[static_cast<size_t>(i * E + e)];
      load[range_.layer(i) * E + e] += n;
      n = 0;
    }
}


template <class Ops>
void GptStage<Ops>::attend(LayerActs& a, AttnState* state) {
  if (opt_.cp > 1) {
    cp_.forward(a.qkv.get(), a.atty.get(), state, document_positions());
    return;
  }
  Ops::attention_forward(ctx_, a.atty.get(), state, a.qkv.get(), B_, T_, ca_, nh_, nkv_,
                         positions_);
}

template <class Ops>
void GptStage<Ops>::attend_backward(LayerActs& a, AttnState* state) {
  if (opt_.cp > 1) {
    cp_.backward(a.qkv.get(), a.atty.get(), state, datty_.get(), dqkv_.get(), document_positions());
    return;
  }
  Ops::attention_backward(ctx_, dqkv_.get(), datt_.get(), datty_.get(), a.qkv.get(), a.atty.get(),
                          state, B_, T_, ca_, nh_, nkv_, positions_);
}

template <class Ops>
void GptStage<Ops>::rotate(Act* qkv, float sign) {
  if (cfg_.llama())
    Ops::rope_rotate(ctx_, qkv, rope_.get(), B_ * T_, T_, ca_, kv_, cfg_.head_dim(), sign,
                     positions_);
}

template <class Ops>
double GptStage<Ops>::take_loss_sum() {
  const double sum = Ops::read(ctx_, loss_sum_.get());
  Ops::fill_zero(ctx_, loss_sum_.get(), 1);
  return sum;
}

}  // namespace mpiformer
