#include "model/gpt_stage.hpp"

#include <algorithm>
#include <cstring>

#include "host/attention.hpp"
#include "host/crossentropy.hpp"
#include "host/embedding.hpp"
#include "host/gelu.hpp"
#include "host/layernorm.hpp"
#include "host/matmul.hpp"
#include "host/residual.hpp"

namespace mpiformer {

using namespace host;

template <class T>
GptStage<T>::GptStage(const GptConfig& cfg, const StageRange& range, int64_t micro_batch,
                      int num_slots)
    : cfg_(cfg),
      range_(range),
      table_(cfg, range),
      B_(micro_batch),
      T_(cfg.seq_len),
      at_(table_, range) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  params_.assign(table_.total_storage(), T(0));
  grads_.assign(table_.total_storage(), T(0));
  slots_.resize(num_slots);
  for (auto& s : slots_) {
    s.residual.assign(range_.num_layers() + 1, std::vector<T>(BT * C));
    s.layers.resize(range_.num_layers());
    for (auto& a : s.layers) {
      a.ln1.resize(BT * C);
      a.ln1_mean.resize(BT);
      a.ln1_rstd.resize(BT);
      a.qkv.resize(BT * 3 * C);
      a.atty.resize(BT * C);
      a.att.resize(B_ * NH * T_ * T_);
      a.res2.resize(BT * C);
      a.ln2.resize(BT * C);
      a.ln2_mean.resize(BT);
      a.ln2_rstd.resize(BT);
      a.fch.resize(BT * 4 * C);
      a.fch_gelu.resize(BT * 4 * C);
    }
    if (range_.has_head) {
      s.lnf.resize(BT * C);
      s.lnf_mean.resize(BT);
      s.lnf_rstd.resize(BT);
      s.logits.resize(BT * cfg_.padded_vocab());
      s.losses.resize(BT);
    }
  }
  dres_.resize(BT * C);
  dln_.resize(BT * C);
  datty_.resize(BT * C);
  if (range_.num_layers() > 0) {
    dqkv_.resize(BT * 3 * C);
    d4_.resize(BT * 4 * C);
    datt_.resize(B_ * NH * T_ * T_);
  }
}

template <class T>
void GptStage<T>::init_parameters(uint64_t seed) {
  fill_initial_parameters(table_, seed, params_.data());
}

template <class T>
void GptStage<T>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <class T>
double GptStage<T>::forward(int slot, const int32_t* tokens, const T* input,
                            const int32_t* targets, bool for_backward, T grad_scale) {
  Slot& s = slots_[slot];
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  T* P = params_.data();
  if (range_.has_embedding) {
    embedding_forward(s.residual[0].data(), tokens, P + at_.wte,
                      P + at_.wpe, B_, T_, C);
  } else if (input != s.residual[0].data()) {
    std::memcpy(s.residual[0].data(), input, sizeof(T) * BT * C);
  }
  for (int64_t i = 0; i < range_.num_layers(); ++i) {
    const auto w = at_.layer<BlockTensors<const T>>(P, i);
    LayerActs& a = s.layers[i];
    const T* x = s.residual[i].data();
    layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, w.ln1w, w.ln1b, BT,
                      C);
    matmul_forward(a.qkv.data(), a.ln1.data(), w.qkvw, w.qkvb, BT, C, 3 * C);
    attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B_, T_, C, NH);
    matmul_forward(a.res2.data(), a.atty.data(), w.attprojw, w.attprojb, BT, C, C);
    residual_forward(a.res2.data(), x, a.res2.data(), BT * C);
    layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), w.ln2w,
                      w.ln2b, BT, C);
    matmul_forward(a.fch.data(), a.ln2.data(), w.fcw, w.fcb, BT, C, 4 * C);
    gelu_forward(a.fch_gelu.data(), a.fch.data(), BT * 4 * C);
    T* out = s.residual[i + 1].data();
    matmul_forward(out, a.fch_gelu.data(), w.fcprojw, w.fcprojb, BT, 4 * C, C);
    residual_forward(out, a.res2.data(), out, BT * C);
  }
  if (!range_.has_head) return 0.0;
  const int64_t Vp = cfg_.padded_vocab();
  layernorm_forward(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(), s.residual.back().data(),
                    P + at_.lnf_w, P + at_.lnf_b, BT,
                    C);
  matmul_forward(s.logits.data(), s.lnf.data(), P + at_.wte,
                 static_cast<const T*>(nullptr), BT, C, Vp);
  if (for_backward) {
    crossentropy_forward_backward(s.losses.data(), s.logits.data(), targets, BT,
                                  cfg_.vocab_size, Vp, grad_scale);
  } else {
    crossentropy_forward(s.losses.data(), s.logits.data(), targets, BT, cfg_.vocab_size, Vp);
  }
  double sum = 0.0;  // fixed order: the logged loss is reproducible bit for bit
  for (int64_t i = 0; i < BT; ++i) sum += static_cast<double>(s.losses[i]);
  return sum;
}

template <class T>
const T* GptStage<T>::output(int slot) const {
  return slots_[slot].residual.back().data();
}

template <class T>
void GptStage<T>::backward(int slot, const int32_t* tokens, const T* dout,
                           const GradsFinal& grads_final) {
  auto final_from = [&](int64_t offset) {
    if (grads_final) grads_final(offset);
  };
  Slot& s = slots_[slot];
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  T* P = params_.data();
  T* G = grads_.data();
  T* dres = dres_.data();
  if (range_.has_head) {
    const int64_t Vp = cfg_.padded_vocab();
    // The tied head: its weight gradient lands in wte's gradient, which the
    // embedding backward then adds to.
    matmul_backward(dln_.data(), G + at_.wte, static_cast<T*>(nullptr),
                    s.logits.data(), s.lnf.data(), P + at_.wte, BT, C, Vp);
    std::fill(dres, dres + BT * C, T(0));
    layernorm_backward(dres, G + at_.lnf_w,
                       G + at_.lnf_b, dln_.data(), s.residual.back().data(),
                       P + at_.lnf_w, s.lnf_mean.data(),
                       s.lnf_rstd.data(), BT, C);
    final_from(at_.lnf_w);
  } else {
    std::memcpy(dres, dout, sizeof(T) * BT * C);
  }
  for (int64_t i = range_.num_layers() - 1; i >= 0; --i) {
    const auto w = at_.layer<BlockTensors<const T>>(P, i);
    const auto g = at_.layer<BlockTensors<T>>(G, i);
    LayerActs& a = s.layers[i];
    // MLP: dres is the gradient of the block output, which is also the
    // gradient of the MLP projection's output (residual backward = identity).
    matmul_backward(d4_.data(), g.fcprojw, g.fcprojb, dres, a.fch_gelu.data(), w.fcprojw, BT,
                    4 * C, C);
    gelu_backward(d4_.data(), a.fch.data(), d4_.data(), BT * 4 * C);
    matmul_backward(dln_.data(), g.fcw, g.fcb, d4_.data(), a.ln2.data(), w.fcw, BT, C, 4 * C);
    layernorm_backward(dres, g.ln2w, g.ln2b, dln_.data(), a.res2.data(), w.ln2w,
                       a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
    // Attention, the same way round.
    matmul_backward(datty_.data(), g.attprojw, g.attprojb, dres, a.atty.data(), w.attprojw, BT,
                    C, C);
    attention_backward(dqkv_.data(), datt_.data(), datty_.data(), a.qkv.data(), a.att.data(), B_,
                       T_, C, NH);
    matmul_backward(dln_.data(), g.qkvw, g.qkvb, dqkv_.data(), a.ln1.data(), w.qkvw, BT, C,
                    3 * C);
    layernorm_backward(dres, g.ln1w, g.ln1b, dln_.data(), s.residual[i].data(), w.ln1w,
                       a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
    final_from(at_.layers[i][0]);
  }
  if (range_.has_embedding) {
    embedding_backward(G + at_.wte, G + at_.wpe, dres, tokens,
                       B_, T_, C);
  }
  final_from(0);
}

template class GptStage<float>;
template class GptStage<double>;

}  // namespace mpiformer
