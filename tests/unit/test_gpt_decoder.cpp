// The KV-cache decoder gives, token by token, the logits the stage's full
// forward pass gives at every position of the window (the reference shares
// the kernels' maths but none of the decoder's caching, positions or
// single-query attention). Tolerance 1e-4 (relative to max(1, |logit|)):
// float32 with different summation orders (a GEMV against blocked GEMMs, a
// loop against a GEMM for the scores) differs by ~1e-6 per operation over
// a few layers; a wrong position, head or cached row differs by 1e-2 or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.hpp"
#include "model/gpt_decoder.hpp"
#include "model/gpt_stage.hpp"

namespace mpiformer::test {
namespace {

void check_decoder(const GptConfig& cfg) {
  host::Context ctx;
  HostGptStage<float> stage(ctx, cfg, partition_stage(cfg, 0, 1), 1, 1);
  stage.init_parameters(7);
  Rng rng(3, "tokens");
  std::vector<int32_t> tokens(cfg.seq_len), targets(cfg.seq_len, 0);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.uniform() * cfg.vocab_size) % cfg.vocab_size;
  stage.forward(0, tokens.data(), targets.data(), false, 0.0f);

  GptDecoder decoder(cfg);
  ASSERT_EQ(decoder.table().total_storage(), stage.param_storage());
  std::copy(stage.params(), stage.params() + stage.param_storage(), decoder.params());
  const int64_t Vp = cfg.padded_vocab();
  for (int64_t t = 0; t < cfg.seq_len; ++t) {
    const float* got = decoder.push(tokens[t]);
    const float* want = stage.logits(0) + t * Vp;
    double worst = 0;
    for (int64_t v = 0; v < cfg.vocab_size; ++v) {
      worst = std::max<double>(worst, std::abs(got[v] - want[v]) / std::max(1.0f, std::abs(want[v])));
    }
    EXPECT_LT(worst, 1e-4) << "position " << t;
  }
  EXPECT_EQ(decoder.length(), cfg.seq_len);
  EXPECT_THROW(decoder.push(0), std::logic_error);  // the window is full
  // Starting again reproduces position 0.
  decoder.clear();
  const float* again = decoder.push(tokens[0]);
  EXPECT_LT(std::abs(again[5] - stage.logits(0)[5]), 1e-4 * std::max(1.0f, std::abs(again[5])));
}

GptConfig gpt2_config() {
  GptConfig cfg;
  cfg.n_layer = 3;
  cfg.n_head = 4;
  cfg.n_embd = 32;
  cfg.seq_len = 24;
  cfg.vocab_size = 77;
  return cfg;
}

TEST(GptDecoder, MatchesTheFullForwardAtEveryPosition) { check_decoder(gpt2_config()); }

// Llama: rotary positions at the cached position, a cache of the 2 kv
// heads of 4, RMSNorm, SwiGLU, the untied head.
TEST(GptDecoder, LlamaMatchesTheFullForwardAtEveryPosition) {
  GptConfig cfg = gpt2_config();
  cfg.family = ModelFamily::kLlama;
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 48;
  cfg.tie_embeddings = false;
  check_decoder(cfg);
}

// A Mixture of Experts, sparse and dense layers, both families: each token
// through its top 2 of 4 experts. The stage without a capacity routes as
// generation does (a capacity would let later tokens drop earlier ones'
// assignments, which generation cannot know).
TEST(GptDecoder, MixtureOfExpertsMatchesTheFullForwardAtEveryPosition) {
  GptConfig cfg = gpt2_config();
  cfg.experts = 4;
  cfg.top_k = 2;
  cfg.moe_every = 2;
  cfg.capacity_factor = 0;
  check_decoder(cfg);
  cfg.family = ModelFamily::kLlama;
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 48;
  cfg.tie_embeddings = false;
  cfg.moe_every = 1;
  check_decoder(cfg);
}

}  // namespace
}  // namespace mpiformer::test
