#include "model/gpt_decoder.hpp"

#include <stdexcept>

#include "host/attention.hpp"
#include "host/gelu.hpp"
#include "host/layernorm.hpp"
#include "host/matmul.hpp"
#include "host/residual.hpp"

namespace mpiformer {

GptDecoder::GptDecoder(const GptConfig& cfg)
    : cfg_(cfg),
      table_(cfg, StageRange{0, cfg.n_layer, true, true}),
      at_(table_, StageRange{0, cfg.n_layer, true, true}),
      params_(static_cast<size_t>(table_.total_storage())),
      qkv_(static_cast<size_t>(cfg.n_layer * cfg.seq_len * 3 * cfg.n_embd)) {
  const auto C = static_cast<size_t>(cfg.n_embd);
  for (auto* v : {&x_, &ln_, &atty_, &res2_, &out_}) v->resize(C);
  fch_.resize(4 * C);
  fch_gelu_.resize(4 * C);
  scores_.resize(static_cast<size_t>(cfg.seq_len));
  logits_.resize(static_cast<size_t>(cfg.padded_vocab()));
}

const float* GptDecoder::push(int32_t token) {
  const int64_t C = cfg_.n_embd, NH = cfg_.n_head, T = cfg_.seq_len, p = n_;
  if (p >= T) throw std::logic_error("GptDecoder::push: the window is full");
  const float* W = params_.data();
  const float* wte = W + at_.at(outer::wte);
  const float* wpe = W + at_.at(outer::wpe);
  for (int64_t c = 0; c < C; ++c) x_[c] = wte[token * C + c] + wpe[p * C + c];
  for (int64_t i = 0; i < cfg_.n_layer; ++i) {
    const auto w = at_.block(W, i);
    float* qkv = qkv_.data() + i * T * 3 * C;
    host::layernorm_forward(ln_.data(), &mean_, &rstd_, x_.data(), w[block::ln1_w],
                            w[block::ln1_b], 1, C);
    host::matmul_forward(qkv + p * 3 * C, ln_.data(), w[block::qkv_w], w[block::qkv_b], 1, C,
                         3 * C);
    host::attention_forward_last(atty_.data(), scores_.data(), qkv, p + 1, C, NH);
    host::matmul_forward(res2_.data(), atty_.data(), w[block::attn_proj_w],
                         w[block::attn_proj_b], 1, C, C);
    host::residual_forward(res2_.data(), x_.data(), res2_.data(), C);
    host::layernorm_forward(ln_.data(), &mean_, &rstd_, res2_.data(), w[block::ln2_w],
                            w[block::ln2_b], 1, C);
    host::matmul_forward(fch_.data(), ln_.data(), w[block::fc_w], w[block::fc_b], 1, C, 4 * C);
    host::gelu_forward(fch_gelu_.data(), fch_.data(), 4 * C);
    host::matmul_forward(out_.data(), fch_gelu_.data(), w[block::fc_proj_w],
                         w[block::fc_proj_b], 1, 4 * C, C);
    host::residual_forward(x_.data(), res2_.data(), out_.data(), C);
  }
  host::layernorm_forward(ln_.data(), &mean_, &rstd_, x_.data(), W + at_.at(outer::lnf_w),
                          W + at_.at(outer::lnf_b), 1, C);
  host::matmul_forward(logits_.data(), ln_.data(), wte, static_cast<const float*>(nullptr), 1, C,
                       cfg_.padded_vocab());
  ++n_;
  return logits_.data();
}

}  // namespace mpiformer
