// GptStage's definitions, included once per device by the file that
// instantiates the stage for that device's op set (gpt_stage_host.cpp,
// gpt_stage_cuda.cpp).
#pragma once
#include "model/gpt_stage.hpp"

namespace mpiformer {

template <class Ops>
GptStage<Ops>::GptStage(Context& ctx, const GptConfig& cfg, const StageRange& range,
                        int64_t micro_batch, int num_slots)
    : ctx_(ctx),
      cfg_(cfg),
      range_(range),
      table_(cfg, range),
      B_(micro_batch),
      T_(cfg.seq_len),
      at_(table_, range) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head, L = range_.num_layers();
  // Every allocation is counted: stage_footprint must predict the sum.
  auto act = [&](int64_t count) {
    allocated_ += count * static_cast<int64_t>(sizeof(Act));
    return Buffer<Act>(static_cast<size_t>(count));
  };
  auto acc = [&](int64_t count) {
    allocated_ += count * static_cast<int64_t>(sizeof(Acc));
    return Buffer<Acc>(static_cast<size_t>(count));
  };
  auto tokens = [&](int64_t count) {
    allocated_ += count * static_cast<int64_t>(sizeof(int32_t));
    return typename Ops::Tokens(count);
  };
  const int64_t n = table_.total_storage();
  params_ = acc(n);
  grads_ = acc(n);
  Ops::fill_zero(ctx_, params_.get(), n);
  Ops::fill_zero(ctx_, grads_.get(), n);
  if constexpr (std::is_same_v<Act, Acc>) {
    weights_ = params_.get();
  } else {
    weight_copy_ = act(n);
    weights_ = weight_copy_.get();
  }
  slots_.resize(static_cast<size_t>(num_slots));
  for (Slot& s : slots_) {
    for (int64_t i = 0; i <= L; ++i) s.residual.push_back(act(BT * C));
    s.layers.resize(static_cast<size_t>(L));
    for (LayerActs& a : s.layers) {
      a.ln1 = act(BT * C);
      a.ln1_mean = acc(BT);
      a.ln1_rstd = acc(BT);
      a.qkv = act(BT * 3 * C);
      a.atty = act(BT * C);
      a.att = act(B_ * NH * T_ * T_);
      a.res2 = act(BT * C);
      a.ln2 = act(BT * C);
      a.ln2_mean = acc(BT);
      a.ln2_rstd = acc(BT);
      a.fch = act(BT * 4 * C);
      a.fch_gelu = act(BT * 4 * C);
    }
    if (range_.has_embedding) s.tokens = tokens(BT);
    if (range_.has_head) {
      s.lnf = act(BT * C);
      s.lnf_mean = acc(BT);
      s.lnf_rstd = acc(BT);
      s.logits = act(BT * cfg_.padded_vocab());
      s.losses = acc(BT);
      s.targets = tokens(BT);
    }
  }
  dres_ = act(BT * C);
  dln_ = act(BT * C);
  datty_ = act(BT * C);
  if (L > 0) {
    dqkv_ = act(BT * 3 * C);
    d4_ = act(BT * 4 * C);
    datt_ = act(B_ * NH * T_ * T_);
    ctx_.reserve_attention(B_, T_, C, sizeof(Act));
  }
  if (!range_.has_head) grad_in_ = act(BT * C);
  loss_sum_ = Buffer<double>(1);
  allocated_ += static_cast<int64_t>(sizeof(double));
  Ops::fill_zero(ctx_, loss_sum_.get(), 1);
}

template <class Ops>
void GptStage<Ops>::refresh_weights() {
  if constexpr (!std::is_same_v<Act, Acc>)
    Ops::convert(ctx_, weights_, params_.get(), table_.total_storage());
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
  Ops::fill_zero(ctx_, grads_.get(), table_.total_storage());
}

template <class Ops>
void GptStage<Ops>::forward(int slot, const int32_t* tokens, const int32_t* targets,
                            bool for_backward, Acc grad_scale) {
  Slot& s = slots_[slot];
  const int64_t BT = B_ * T_, C = cfg_.n_embd;
  const Act* W = weights_;
  // Every host-to-device copy first, before any op of this micro-batch is
  // queued, so the device never waits on the host in the middle.
  if (range_.has_embedding) Ops::load_tokens(ctx_, s.tokens, tokens, BT, true);
  if (range_.has_head) Ops::load_tokens(ctx_, s.targets, targets, BT, false);
  if (range_.has_embedding) {
    Ops::embedding_forward(ctx_, s.residual[0].get(), s.tokens, W + at_.at(outer::wte),
                           W + at_.at(outer::wpe), B_, T_, C);
  }
  for (int64_t i = 0; i < range_.num_layers(); ++i) forward_block(s, i);
  if (!range_.has_head) return;
  const int64_t Vp = cfg_.padded_vocab();
  Ops::layernorm_forward(ctx_, s.lnf.get(), s.lnf_mean.get(), s.lnf_rstd.get(),
                         s.residual.back().get(), W + at_.at(outer::lnf_w),
                         W + at_.at(outer::lnf_b), BT, C);
  Ops::matmul_forward(ctx_, s.logits.get(), s.lnf.get(), W + at_.at(outer::wte),
                      static_cast<const Act*>(nullptr), BT, C, Vp);
  if (for_backward) {
    Ops::crossentropy_forward_backward(ctx_, s.losses.get(), s.logits.get(), s.targets, BT,
                                       cfg_.vocab_size, Vp, grad_scale);
  } else {
    Ops::crossentropy_forward(ctx_, s.losses.get(), s.logits.get(), s.targets, BT,
                              cfg_.vocab_size, Vp);
  }
  Ops::accumulate_sum(ctx_, loss_sum_.get(), s.losses.get(), BT);
}

template <class Ops>
void GptStage<Ops>::forward_block(Slot& s, int64_t i) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  const auto w = at_.block(static_cast<const Act*>(weights_), i);
  LayerActs& a = s.layers[i];
  const Act* x = s.residual[i].get();
  Ops::layernorm_forward(ctx_, a.ln1.get(), a.ln1_mean.get(), a.ln1_rstd.get(), x,
                         w[block::ln1_w], w[block::ln1_b], BT, C);
  Ops::matmul_forward(ctx_, a.qkv.get(), a.ln1.get(), w[block::qkv_w], w[block::qkv_b], BT, C,
                      3 * C);
  Ops::attention_forward(ctx_, a.atty.get(), a.att.get(), a.qkv.get(), B_, T_, C, NH);
  Ops::matmul_forward(ctx_, a.res2.get(), a.atty.get(), w[block::attn_proj_w],
                      w[block::attn_proj_b], BT, C, C);
  Ops::residual_forward(ctx_, a.res2.get(), x, a.res2.get(), BT * C);
  Ops::layernorm_forward(ctx_, a.ln2.get(), a.ln2_mean.get(), a.ln2_rstd.get(), a.res2.get(),
                         w[block::ln2_w], w[block::ln2_b], BT, C);
  Ops::matmul_forward(ctx_, a.fch.get(), a.ln2.get(), w[block::fc_w], w[block::fc_b], BT, C,
                      4 * C);
  Ops::gelu_forward(ctx_, a.fch_gelu.get(), a.fch.get(), BT * 4 * C);
  Act* out = s.residual[i + 1].get();
  Ops::matmul_forward(ctx_, out, a.fch_gelu.get(), w[block::fc_proj_w], w[block::fc_proj_b], BT,
                      4 * C, C);
  Ops::residual_forward(ctx_, out, a.res2.get(), out, BT * C);
}

template <class Ops>
void GptStage<Ops>::backward(int slot, const GradsFinal& grads_final) {
  auto final_from = [&](int64_t offset) {
    if (grads_final) grads_final(offset);
  };
  Slot& s = slots_[slot];
  const int64_t BT = B_ * T_, C = cfg_.n_embd;
  const Act* W = weights_;
  Acc* G = grads_.get();
  Act* dres = dres_.get();
  if (range_.has_head) {
    const int64_t Vp = cfg_.padded_vocab();
    // The tied head: its weight gradient lands in wte's gradient, which the
    // embedding backward then adds to.
    Ops::matmul_backward(ctx_, dln_.get(), G + at_.at(outer::wte), static_cast<Acc*>(nullptr),
                         s.logits.get(), s.lnf.get(), W + at_.at(outer::wte), BT, C, Vp);
    Ops::fill_zero(ctx_, dres, BT * C);
    Ops::layernorm_backward(ctx_, dres, G + at_.at(outer::lnf_w), G + at_.at(outer::lnf_b),
                            dln_.get(), s.residual.back().get(), W + at_.at(outer::lnf_w),
                            s.lnf_mean.get(), s.lnf_rstd.get(), BT, C);
    final_from(at_.at(outer::lnf_w));
  } else {
    Ops::copy(ctx_, dres, static_cast<const Act*>(grad_in_.get()), BT * C);
  }
  for (int64_t i = range_.num_layers() - 1; i >= 0; --i) {
    backward_block(s, i);
    final_from(at_.layers[i][0]);
  }
  if (range_.has_embedding) {
    Ops::embedding_backward(ctx_, G + at_.at(outer::wte), G + at_.at(outer::wpe), dres, s.tokens,
                            B_, T_, C);
  }
  final_from(0);
}

template <class Ops>
void GptStage<Ops>::backward_block(Slot& s, int64_t i) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  const auto w = at_.block(static_cast<const Act*>(weights_), i);
  const auto g = at_.block(grads_.get(), i);
  LayerActs& a = s.layers[i];
  Act* dres = dres_.get();
  // MLP: dres is the gradient of the block output, which is also the
  // gradient of the MLP projection's output (residual backward = identity).
  Ops::matmul_backward(ctx_, d4_.get(), g[block::fc_proj_w], g[block::fc_proj_b], dres,
                       a.fch_gelu.get(), w[block::fc_proj_w], BT, 4 * C, C);
  Ops::gelu_backward(ctx_, d4_.get(), a.fch.get(), d4_.get(), BT * 4 * C);
  Ops::matmul_backward(ctx_, dln_.get(), g[block::fc_w], g[block::fc_b], d4_.get(), a.ln2.get(),
                       w[block::fc_w], BT, C, 4 * C);
  Ops::layernorm_backward(ctx_, dres, g[block::ln2_w], g[block::ln2_b], dln_.get(), a.res2.get(),
                          w[block::ln2_w], a.ln2_mean.get(), a.ln2_rstd.get(), BT, C);
  // Attention, the same way round.
  Ops::matmul_backward(ctx_, datty_.get(), g[block::attn_proj_w], g[block::attn_proj_b], dres,
                       a.atty.get(), w[block::attn_proj_w], BT, C, C);
  Ops::attention_backward(ctx_, dqkv_.get(), datt_.get(), datty_.get(), a.qkv.get(), a.att.get(),
                          B_, T_, C, NH);
  Ops::matmul_backward(ctx_, dln_.get(), g[block::qkv_w], g[block::qkv_b], dqkv_.get(),
                       a.ln1.get(), w[block::qkv_w], BT, C, 3 * C);
  Ops::layernorm_backward(ctx_, dres, g[block::ln1_w], g[block::ln1_b], dln_.get(),
                          s.residual[i].get(), w[block::ln1_w], a.ln1_mean.get(),
                          a.ln1_rstd.get(), BT, C);
}

template <class Ops>
double GptStage<Ops>::take_loss_sum() {
  const double sum = Ops::read(ctx_, loss_sum_.get());
  Ops::fill_zero(ctx_, loss_sum_.get(), 1);
  return sum;
}

}  // namespace mpiformer
