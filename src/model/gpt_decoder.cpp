#include "model/gpt_decoder.hpp"

#include <algorithm>
#include <stdexcept>

#include "common/moe_routing.hpp"
#include "host/attention.hpp"
#include "host/gelu.hpp"
#include "host/layernorm.hpp"
#include "host/matmul.hpp"
#include "host/residual.hpp"
#include "host/rmsnorm.hpp"
#include "host/rope.hpp"
#include "host/swiglu.hpp"

namespace mpiformer {

GptDecoder::GptDecoder(const GptConfig& cfg)
    : cfg_(cfg),
      table_(cfg, StageRange{0, cfg.n_layer, true, true}),
      at_(table_, StageRange{0, cfg.n_layer, true, true}),
      params_(static_cast<size_t>(table_.total_storage())),
      kv_(static_cast<size_t>(cfg.n_layer * cfg.seq_len * 2 * cfg.kv_dim())) {
  const auto C = static_cast<size_t>(cfg.n_embd);
  for (auto* v : {&x_, &ln_, &atty_, &res2_, &out_}) v->resize(C);
  qkv_.resize(static_cast<size_t>(cfg.qkv_dim()));
  fch_.resize(static_cast<size_t>(cfg.ffn_in()));
  fch_gelu_.resize(static_cast<size_t>(cfg.ffn()));
  scores_.resize(static_cast<size_t>(cfg.seq_len));
  logits_.resize(static_cast<size_t>(cfg.padded_vocab()));
  if (cfg.llama()) rope_ = host::rope_table(cfg.seq_len, cfg.head_dim(), cfg.rope_theta);
  if (cfg.moe()) {
    router_.resize(static_cast<size_t>(2 * cfg.experts));
    chosen_.resize(static_cast<size_t>(cfg.top_k));
    gates_.resize(static_cast<size_t>(cfg.top_k));
    expert_out_.resize(C);
  }
}

// One row's MLP into `out`: the dense one, or (a sparse block) its top-k
// experts' weighed by their gates. Generation routes each token alone,
// without a capacity: a sequence's drops depend on its later tokens,
// which do not exist yet (inference is dropless, as Megatron's and
// Hugging Face's Mixtral are).
void GptDecoder::mlp(float* out, const BlockView<const float>& w, bool sparse) {
  const int64_t C = cfg_.n_embd, F = cfg_.ffn();
  const auto expert = [&](float* y, int64_t e) {
    host::matmul_forward(fch_.data(), ln_.data(), w.expert(block::fc_w, e), w.expert(block::fc_b, e),
                         1, C, cfg_.ffn_in());
    if (cfg_.llama()) host::swiglu_forward(fch_gelu_.data(), fch_.data(), 1, F);
    else host::gelu_forward(fch_gelu_.data(), fch_.data(), F);
    host::matmul_forward(y, fch_gelu_.data(), w.expert(block::fc_proj_w, e),
                         w.expert(block::fc_proj_b, e), 1, F, C);
  };
  if (!sparse) {
    expert(out, 0);
    return;
  }
  const int64_t E = cfg_.experts;
  float* logits = router_.data();
  float lse = 0;
  host::matmul_forward(logits, ln_.data(), w[block::router_w], static_cast<const float*>(nullptr), 1,
                       C, E);
  router_token(logits, logits + E, lse, chosen_.data(), gates_.data(), E, cfg_.top_k);
  std::fill_n(out, C, 0.f);
  for (int64_t j = 0; j < cfg_.top_k; ++j) {
    expert(expert_out_.data(), chosen_[static_cast<size_t>(j)]);
    for (int64_t c = 0; c < C; ++c) out[c] += gates_[static_cast<size_t>(j)] * expert_out_[static_cast<size_t>(c)];
  }
}

void GptDecoder::norm(const float* x, const float* w, const float* b) {
  if (cfg_.llama()) host::rmsnorm_forward(ln_.data(), &rstd_, x, w, 1, cfg_.n_embd, cfg_.norm_eps);
  else host::layernorm_forward(ln_.data(), &mean_, &rstd_, x, w, b, 1, cfg_.n_embd);
}

const float* GptDecoder::push(int32_t token) {
  const int64_t C = cfg_.n_embd, NH = cfg_.n_head, NKV = cfg_.kv_heads(), K = cfg_.kv_dim();
  const int64_t T = cfg_.seq_len, p = n_;
  if (p >= T) throw std::logic_error("GptDecoder::push: the window is full");
  const float* W = params_.data();
  const float* wte = W + at_.at(outer::wte);
  for (int64_t c = 0; c < C; ++c)
    x_[c] = wte[token * C + c] + (cfg_.llama() ? 0.f : W[at_.at(outer::wpe) + p * C + c]);
  for (int64_t i = 0; i < cfg_.n_layer; ++i) {
    const auto w = at_.block(W, i);
    float* kv = kv_.data() + i * T * 2 * K;
    norm(x_.data(), w[block::ln1_w], w[block::ln1_b]);
    host::matmul_forward(qkv_.data(), ln_.data(), w[block::qkv_w], w[block::qkv_b], 1, C, C + 2 * K);
    // Rotated at position p (the table's row p), then k and v into the cache.
    if (cfg_.llama()) host::rope_rotate(qkv_.data(), rope_.data() + p * cfg_.head_dim(), 1, 1, C, K, cfg_.head_dim(), 1.f);
    std::copy_n(qkv_.data() + C, 2 * K, kv + p * 2 * K);
    host::attention_forward_last(atty_.data(), scores_.data(), qkv_.data(), kv, p + 1, C, NH, NKV);
    host::matmul_forward(res2_.data(), atty_.data(), w[block::attn_proj_w],
                         w[block::attn_proj_b], 1, C, C);
    host::residual_forward(res2_.data(), x_.data(), res2_.data(), C);
    norm(res2_.data(), w[block::ln2_w], w[block::ln2_b]);
    mlp(out_.data(), w, cfg_.moe_layer(i));
    host::residual_forward(x_.data(), res2_.data(), out_.data(), C);
  }
  norm(x_.data(), W + at_.at(outer::lnf_w),
       at_.at(outer::lnf_b) < 0 ? nullptr : W + at_.at(outer::lnf_b));
  host::matmul_forward(logits_.data(), ln_.data(), W + at_.head(), static_cast<const float*>(nullptr),
                       1, C, cfg_.padded_vocab());
  ++n_;
  return logits_.data();
}

}  // namespace mpiformer
