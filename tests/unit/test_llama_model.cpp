// The Llama-family stage against a forward written here from the model's
// definition with plain double loops (no kernel, no stage code): RMSNorm,
// q/k/v rows of the fused projection, rotary positions on pairs (i, i +
// hs/2) at theta^(-2i/hs), grouped-query causal attention, SwiGLU from the
// gate and up rows, the untied (or tied) head. Then every parameter's
// gradient against central finite differences of the stage's loss, under
// each recomputation (the backward of RMSNorm, RoPE, SwiGLU and grouped
// attention in place in the stage). In double, the forward agrees to 1e-7:
// the rotary table is float on every back end (host/rope.hpp), so its
// cos and sin carry float rounding (6e-8 relative), which reaches the
// logits as ~5e-9 here; a wrong base, pairing, position or kv head moves
// them by 1e-2 or more. The gradients: the tolerance of GPT-2's
// (test_model_gradients.cpp).
#include <cmath>
#include <cstring>
#include <map>

#include "model/gpt_stage.hpp"
#include "naive_llama.hpp"
#include "reference.hpp"
#include "stage_gradients.hpp"

namespace mpiformer::test {
namespace {

GptConfig llama_config(bool tied) {
  GptConfig c;
  c.family = ModelFamily::kLlama;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.ffn_hidden = 12;
  c.seq_len = 5;
  c.vocab_size = 11;
  c.rope_theta = 500.0;  // not the default: a wrong base shows
  c.norm_eps = 1e-5;
  c.tie_embeddings = tied;
  return c;
}


const std::vector<int32_t> kTok = {1, 5, 10, 3, 0, 7, 7, 2, 9, 4};
const std::vector<int32_t> kTgt = {5, 10, 3, 9, 7, 7, 2, 4, 1, 6};

TEST(LlamaModel, ForwardMatchesTheModelsDefinition) {
  for (bool tied : {false, true}) {
    const GptConfig cfg = llama_config(tied);
    const int64_t B = 2, T = cfg.seq_len, V = cfg.vocab_size, Vp = cfg.padded_vocab();
    host::Context ctx;
    HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), B, 1);
    randomise_parameters(stage, 300);
    stage.forward(0, kTok.data(), kTgt.data(), false, 0.0);
    const auto want = naive_llama(cfg, stage, kTok, B);
    std::vector<double> got(B * T * V);
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t v = 0; v < V; ++v) got[r * V + v] = stage.logits(0)[r * Vp + v];
    EXPECT_TRUE(all_close(got, want, 1e-7, 1e-7)) << (tied ? "tied" : "untied");
  }
}

TEST(LlamaModel, EveryParameterGradientMatchesFiniteDifferences) {
  for (const Recompute rc : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
    const GptConfig cfg = llama_config(false);
    const int64_t B = 2, T = cfg.seq_len;
    host::Context ctx;
    StageOptions opt{B, 1};
    opt.recompute = rc;
    HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), opt);
    randomise_parameters(stage, 400);
    const double scale = 1.0 / static_cast<double>(B * T);
    const int64_t checked = expect_gradients_match_finite_differences(
        stage, kTok, kTgt, scale, std::string(", recompute ") + name_of(rc));
    EXPECT_EQ(checked, stage.table().total_numel());
  }
}

}  // namespace
}  // namespace mpiformer::test
