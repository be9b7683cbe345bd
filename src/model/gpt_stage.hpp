// Forward and backward of one pipeline stage of GPT-2: an optional embedding,
// a range of transformer blocks, and optionally the final LayerNorm, the tied
// LM head and the loss. The stage does not know who sends it activations or
// receives its gradients: the trainer moves them.
//
// Buffers are planned once at construction for a fixed micro-batch shape
// [B, T]; nothing is allocated during forward or backward. Activations live in
// `slots`, one per micro-batch that may be in flight at once (1 without
// pipelining); backward scratch is shared by all slots.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/gpt_config.hpp"
#include "model/parameter_table.hpp"
#include "model/stage_layout.hpp"

namespace mpiformer {

template <class T>
class GptStage {
 public:
  GptStage(const GptConfig& cfg, const StageRange& range, int64_t micro_batch, int num_slots);

  const GptConfig& config() const { return cfg_; }
  const StageRange& range() const { return range_; }
  const ParameterTable& table() const { return table_; }
  int num_slots() const { return static_cast<int>(slots_.size()); }

  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  int64_t param_storage() const { return table_.total_storage(); }

  // GPT-2 initialisation; each tensor's values depend only on (seed, name),
  // so every layout initialises the same model.
  void init_parameters(uint64_t seed);
  void zero_grads();

  // Where a non-first stage's input activation for `slot` lives [B,T,C]:
  // receive into it and pass it to forward() to avoid a copy.
  T* input_buffer(int slot) { return slots_[slot].residual[0].data(); }

  // Forward of one micro-batch into `slot`. The first stage embeds `tokens`
  // [B,T]; any other stage reads `input` [B,T,C]. The last stage computes the
  // per-token losses against `targets` [B,T] and returns their sum (0 on
  // other stages). With `for_backward`, the last stage also leaves
  // dloss/dlogits (scaled by grad_scale) ready for backward().
  double forward(int slot, const int32_t* tokens, const T* input, const int32_t* targets,
                 bool for_backward, T grad_scale);
  // The residual stream leaving this stage [B,T,C] (non-last stages).
  const T* output(int slot) const;

  // Backward of the micro-batch in `slot`; parameter gradients accumulate.
  // The last stage starts from its loss; others read `dout` [B,T,C].
  // `tokens` is needed by the first stage's embedding backward.
  // Backward runs from the end of the parameter buffer to its start; when
  // given, `grads_final(offset)` is called each time every gradient at
  // offsets >= offset has received this micro-batch's contribution (after
  // the head, after each layer, and with 0 at the end), so a caller can
  // start reducing them while the rest of the backward runs.
  using GradsFinal = std::function<void(int64_t offset)>;
  void backward(int slot, const int32_t* tokens, const T* dout,
                const GradsFinal& grads_final = nullptr);
  // Gradient with respect to this stage's input [B,T,C] (non-first stages).
  const T* input_grad() const { return dres_.data(); }

  // Logits [B*T, padded_vocab] of the last forward into `slot` made without
  // for_backward (with it, the buffer holds their gradient instead).
  const T* logits(int slot) const { return slots_[slot].logits.data(); }

  // Per-token losses of the last forward into `slot` [B*T].
  const T* losses(int slot) const { return slots_[slot].losses.data(); }

 private:
  struct LayerActs {
    std::vector<T> ln1, ln1_mean, ln1_rstd, qkv, atty, att, res2, ln2, ln2_mean, ln2_rstd, fch,
        fch_gelu;
  };
  struct Slot {
    std::vector<std::vector<T>> residual;  // [layers + 1][B*T*C]
    std::vector<LayerActs> layers;
    std::vector<T> lnf, lnf_mean, lnf_rstd, logits, losses;
  };
  GptConfig cfg_;
  StageRange range_;
  ParameterTable table_;
  int64_t B_, T_;
  StageLayout at_;
  std::vector<T> params_, grads_;
  std::vector<Slot> slots_;
  // Backward scratch, shared by all slots.
  std::vector<T> dres_, dln_, datty_, dqkv_, d4_, datt_;
};

extern template class GptStage<float>;
extern template class GptStage<double>;

}  // namespace mpiformer
