// A Mixture of Experts in the stage, both families:
//  - Llama's logits against naive_llama.hpp's (the sparse MLP written from
//    its definition, each sequence routed by moe_reference.hpp's router),
//    with assignments dropped over capacity and without a capacity, and
//    the aux and z losses the stage reports against that router's;
//  - every parameter's gradient (the router's through the gates and both
//    losses, every expert's) against central finite differences, GPT-2's
//    and Llama's (recomputing), a sparse and a dense layer;
//  - a micro-batch of two sequences against two of one (capacity is per
//    sequence, so the split changes no decision).
// Tolerances: the forward in double as test_llama_model.cpp's (1e-7, the
// rotary table's float rounding); the gradients as stage_gradients.hpp
// says; the split exact to rounding (1e-12).
#include <cstring>

#include "model/gpt_stage.hpp"
#include "naive_llama.hpp"
#include "reference.hpp"
#include "stage_gradients.hpp"

namespace mpiformer::test {
namespace {

// 4 experts, top 2; the losses' weights larger than their defaults so a
// wrong term in their gradients shows.
GptConfig moe_config(ModelFamily family, double capacity_factor, int64_t moe_every) {
  GptConfig c;
  c.family = family;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  c.seq_len = 5;
  c.vocab_size = 11;
  if (family == ModelFamily::kLlama) {
    c.n_kv_head = 2;
    c.ffn_hidden = 12;
    c.rope_theta = 500.0;
    c.tie_embeddings = false;
  }
  c.experts = 4;
  c.top_k = 2;
  c.moe_every = moe_every;
  c.capacity_factor = capacity_factor;
  c.aux_loss = 0.3;
  c.router_z_loss = 0.2;
  return c;
}

const std::vector<int32_t> kTok = {1, 5, 10, 3, 0, 7, 7, 2, 9, 4};
const std::vector<int32_t> kTgt = {5, 10, 3, 9, 7, 7, 2, 4, 1, 6};

TEST(MoeModel, LlamaForwardMatchesTheModelsDefinition) {
  // Capacity ceil(1.0 x 5 x 2 / 4) = 3 of a sequence's 10 assignments per
  // expert: the router drops some (checked); then no limit.
  for (const double cf : {1.0, 0.0}) {
    const GptConfig cfg = moe_config(ModelFamily::kLlama, cf, 1);
    const int64_t B = 2, T = cfg.seq_len, V = cfg.vocab_size, Vp = cfg.padded_vocab();
    host::Context ctx;
    HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), B, 1);
    randomise_parameters(stage, 500);
    stage.forward(0, kTok.data(), kTgt.data(), false, 0.0);
    Naive routed;
    const auto want = naive_llama(cfg, stage, kTok, B, &routed);
    std::vector<double> got(B * T * V);
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t v = 0; v < V; ++v) got[r * V + v] = stage.logits(0)[r * Vp + v];
    EXPECT_TRUE(all_close(got, want, 1e-7, 1e-7)) << "capacity factor " << cf;
    double totals[kRouterTotals] = {};
    std::vector<double> load(static_cast<size_t>(cfg.n_layer * cfg.experts));
    stage.take_router_stats(totals, load.data());
    EXPECT_NEAR(totals[kAuxSum], routed.aux, 1e-9 * routed.aux);
    EXPECT_NEAR(totals[kZSum], routed.z, 1e-9 * routed.z);
    // Every kept assignment is one expert's row: the rows and the drops
    // account for all B T k of each layer.
    double rows = 0;
    for (double n : load) rows += n;
    EXPECT_EQ(rows + totals[kDropped], static_cast<double>(cfg.n_layer * B * T * cfg.top_k));
    if (cf > 0) EXPECT_GT(totals[kDropped], 0) << "the test must drop some assignments";
    else EXPECT_EQ(totals[kDropped], 0);
  }
}

TEST(MoeModel, EveryParameterGradientMatchesFiniteDifferences) {
  // moe_every 2: layer 0 sparse, layer 1 dense. GPT-2 keeping everything,
  // Llama recomputing everything (the routing again in backward).
  for (const ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    const Recompute rc = family == ModelFamily::kGpt2 ? Recompute::kNone : Recompute::kFull;
    // Half the width (the check's cost grows with the parameters squared).
    GptConfig cfg = moe_config(family, 1.0, 2);
    cfg.n_embd = 8;
    cfg.n_head = 2;
    if (family == ModelFamily::kLlama) {
      cfg.n_kv_head = 1;
      cfg.ffn_hidden = 8;
    }
    const int64_t B = 2, T = cfg.seq_len;
    host::Context ctx;
    StageOptions opt{B, 1};
    opt.recompute = rc;
    HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), opt);
    ASSERT_NE(stage.table().find("h.0.mlp.experts.3.down_proj.weight") != nullptr ||
                  stage.table().find("h.0.mlp.experts.3.c_proj.weight") != nullptr,
              false);
    ASSERT_EQ(stage.table().find("h.1.mlp.router.weight"), nullptr);
    randomise_parameters(stage, 600);
    const double scale = 1.0 / static_cast<double>(B * T);
    const int64_t checked = expect_gradients_match_finite_differences(
        stage, kTok, kTgt, scale, std::string(", ") + name_of(family) + ", recompute " + name_of(rc));
    EXPECT_EQ(checked, stage.table().total_numel());
  }
}

TEST(MoeModel, TwoMicroBatchesOfOneSequenceEqualOneOfTwo) {
  const GptConfig cfg = moe_config(ModelFamily::kGpt2, 1.0, 1);
  const int64_t T = cfg.seq_len;
  const double scale = 1.0 / static_cast<double>(2 * T);
  host::Context ctx;
  HostGptStage<double> whole(ctx, cfg, partition_stage(cfg, 0, 1), 2, 1);
  HostGptStage<double> split(ctx, cfg, partition_stage(cfg, 0, 1), 1, 1);
  randomise_parameters(whole, 700);
  randomise_parameters(split, 700);
  whole.zero_grads();
  whole.forward(0, kTok.data(), kTgt.data(), true, scale);
  whole.backward(0);
  split.zero_grads();
  for (int m = 0; m < 2; ++m) {
    split.forward(0, kTok.data() + m * T, kTgt.data() + m * T, true, scale);
    split.backward(0);
  }
  EXPECT_NEAR(whole.take_loss_sum(), split.take_loss_sum(), 1e-12);
  double tw[kRouterTotals] = {}, ts[kRouterTotals] = {};
  std::vector<double> lw(static_cast<size_t>(cfg.n_layer * cfg.experts)), ls(lw.size());
  whole.take_router_stats(tw, lw.data());
  split.take_router_stats(ts, ls.data());
  for (int k = 0; k < kRouterTotals; ++k) EXPECT_NEAR(tw[k], ts[k], 1e-12) << k;
  EXPECT_EQ(lw, ls);
  const int64_t n = whole.table().total_storage();
  const std::vector<double> gw(whole.grads(), whole.grads() + n), gs(split.grads(), split.grads() + n);
  EXPECT_TRUE(all_close(gs, gw, 1e-12, 1e-10));
}

}  // namespace
}  // namespace mpiformer::test
