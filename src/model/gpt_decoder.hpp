// Incremental inference of the whole model on the host, for `generate`:
// one token at a time, with each layer's keys and values of the earlier
// positions kept (a KV cache), so a token costs O(layers x C^2 + position x
// C) instead of a forward pass over the whole window; the cache holds the
// kv heads only (grouped-query attention keeps NKV of NH). Runs the block's
// op sequence of GptStage::forward_block on one row with the host kernels;
// tests/unit/test_gpt_decoder.cpp checks it gives the stage's logits at
// every position. A Mixture of Experts' tokens are routed without a
// capacity (GptDecoder::mlp).
#pragma once
#include <cstdint>
#include <vector>

#include "core/gpt_config.hpp"
#include "model/parameter_table.hpp"
#include "model/stage_layout.hpp"

namespace mpiformer {

class GptDecoder {
 public:
  explicit GptDecoder(const GptConfig& cfg);
  // The weights, in table() order (the layout of a one-stage GptStage), to
  // be filled before the first push().
  float* params() { return params_.data(); }
  const ParameterTable& table() const { return table_; }

  // Appends `token` at position length() (< seq_len) and returns the logits
  // [padded_vocab] for the token after it (valid until the next push).
  const float* push(int32_t token);
  int64_t length() const { return n_; }
  // Forgets every position (to start again on a shifted window).
  void clear() { n_ = 0; }

 private:
  GptConfig cfg_;
  ParameterTable table_;
  StageLayout at_;
  std::vector<float> params_;
  std::vector<float> kv_;   // per layer [seq_len, 2K]: every position's k, v
  std::vector<float> rope_;  // Llama: host/rope.hpp's table
  std::vector<float> x_, ln_, qkv_, atty_, res2_, fch_, fch_gelu_, out_, scores_, logits_;
  // A Mixture of Experts: the router's logits and probabilities, a
  // token's experts and gates, one expert's output.
  std::vector<float> router_, gates_, expert_out_;
  std::vector<int32_t> chosen_;
  float mean_ = 0, rstd_ = 0;
  int64_t n_ = 0;
  // The family's norm of one row into ln_.
  void norm(const float* x, const float* w, const float* b);
  // The MLP of ln_ (dense, or a sparse block's experts) into `out`.
  void mlp(float* out, const BlockView<const float>& w, bool sparse);
};

}  // namespace mpiformer
