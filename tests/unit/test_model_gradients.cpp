// The whole GPT stage in double: every parameter's gradient against central
// finite differences of the loss; gradient accumulation over micro-batches
// equals one larger batch; initialisation does not depend on the partition.
#include <cstring>
#include <memory>

#include "core/layer_chunks.hpp"

#include "model/gpt_stage.hpp"
#include "reference.hpp"
#include "stage_gradients.hpp"

namespace mpiformer::test {
namespace {

GptConfig tiny_config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.seq_len = 4;
  c.vocab_size = 11;  // padded to 128 inside
  return c;
}


TEST(GptModel, EveryParameterGradientMatchesFiniteDifferences) {
  const GptConfig cfg = tiny_config();
  const int64_t B = 2, T = cfg.seq_len;
  host::Context ctx;
  HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), B, 1);
  randomise_parameters(stage, 100);
  const std::vector<int32_t> tok = {1, 5, 10, 3, 0, 7, 7, 2};
  const std::vector<int32_t> tgt = {5, 10, 3, 9, 7, 7, 2, 4};
  const double scale = 1.0 / static_cast<double>(B * T);

  const int64_t checked = expect_gradients_match_finite_differences(stage, tok, tgt, scale, "");
  EXPECT_EQ(checked, stage.table().total_numel());
  // The padded vocabulary rows never receive gradient.
  const auto& wte = stage.table().at("wte");
  for (int64_t i = wte.numel(); i < wte.storage; ++i) ASSERT_EQ(stage.grads()[wte.offset + i], 0.0);
}

TEST(GptModel, AccumulatedMicroBatchesEqualOneBatch) {
  const GptConfig cfg = tiny_config();
  const int64_t T = cfg.seq_len;
  const std::vector<int32_t> tok = {1, 5, 10, 3, 0, 7, 7, 2};
  const std::vector<int32_t> tgt = {5, 10, 3, 9, 7, 7, 2, 4};
  const double scale = 1.0 / static_cast<double>(2 * T);  // mean over the global batch

  host::Context ctx;
  HostGptStage<double> whole(ctx, cfg, partition_stage(cfg, 0, 1), 2, 1);
  randomise_parameters(whole, 200);
  whole.zero_grads();
  whole.forward(0, tok.data(), tgt.data(), true, scale);
  const double loss_whole = whole.take_loss_sum();
  whole.backward(0);

  HostGptStage<double> split(ctx, cfg, partition_stage(cfg, 0, 1), 1, 1);
  randomise_parameters(split, 200);
  split.zero_grads();
  double loss_split = 0;
  for (int m = 0; m < 2; ++m) {
    split.forward(0, tok.data() + m * T, tgt.data() + m * T, true, scale);
    loss_split += split.take_loss_sum();
    split.backward(0);
  }
  EXPECT_NEAR(loss_split, loss_whole, 1e-12 * std::fabs(loss_whole));
  const int64_t n = whole.param_storage();
  EXPECT_TRUE(all_close(std::vector<double>(split.grads(), split.grads() + n),
                        std::vector<double>(whole.grads(), whole.grads() + n), 1e-14, 1e-10));
}

TEST(GptModel, InitialisationIsIndependentOfThePartition) {
  GptConfig cfg = tiny_config();
  cfg.n_layer = 3;
  host::Context ctx;
  HostGptStage<float> all(ctx, cfg, partition_stage(cfg, 0, 1), 1, 1);
  all.init_parameters(7);
  for (int64_t s = 0; s < 2; ++s) {
    HostGptStage<float> part(ctx, cfg, partition_stage(cfg, s, 2), 1, 1);
    part.init_parameters(7);
    for (const auto& spec : part.table().specs()) {
      const auto& ref = all.table().at(spec.name);
      EXPECT_EQ(0, std::memcmp(part.params() + spec.offset, all.params() + ref.offset,
                               sizeof(float) * spec.storage))
          << spec.name << " on stage " << s;
    }
  }
}

// Interleaving whose layers do not cut evenly (core/layer_chunks.hpp):
// against a naive cut (the pp v chunks in the model's order, each as long
// as the rule's sizes say, handed out to stage g % pp), every stage's
// blocks name the same layers in the same order, block_of inverts layer,
// and chunk_range gives each chunk's extent. Meta's Llama 3 405B shape
// (126 layers on 16 stages) among them.
TEST(GptModel, UnevenInterleavedChunksCoverEveryLayerOnce) {
  struct Case {
    int64_t n, pp, v, first_short, last_short;
  };
  for (const Case k : {Case{8, 2, 2, 0, 0}, Case{6, 2, 2, 1, 1}, Case{7, 2, 2, 0, 1},
                       Case{126, 16, 2, 1, 1}, Case{126, 16, 4, 1, 1}, Case{11, 3, 2, 0, 1},
                       Case{10, 3, 2, 1, 1}}) {
    GptConfig cfg = tiny_config();
    cfg.n_layer = k.n;
    const int64_t chunks = k.pp * k.v, full = (k.n + chunks - 1) / chunks;
    std::vector<std::vector<int64_t>> want(static_cast<size_t>(k.pp));
    std::vector<std::vector<int64_t>> sizes(static_cast<size_t>(k.pp));
    int64_t next = 0;
    for (int64_t g = 0; g < chunks; ++g) {
      const int64_t len = full - (g == 0 ? k.first_short : 0) - (g == chunks - 1 ? k.last_short : 0);
      sizes[static_cast<size_t>(g % k.pp)].push_back(len);
      for (int64_t j = 0; j < len; ++j) want[static_cast<size_t>(g % k.pp)].push_back(next++);
    }
    ASSERT_EQ(next, k.n) << "the case's shortfalls";
    for (int64_t s = 0; s < k.pp; ++s) {
      const StageRange r = partition_stage(cfg, s, k.pp, 1, 0, k.v);
      const auto& w = want[static_cast<size_t>(s)];
      const std::string at = std::to_string(k.n) + " layers, stage " + std::to_string(s);
      ASSERT_EQ(r.num_layers(), static_cast<int64_t>(w.size())) << at;
      for (int64_t i = 0; i < r.num_layers(); ++i) {
        EXPECT_EQ(r.layer(i), w[static_cast<size_t>(i)]) << at << ", block " << i;
        EXPECT_EQ(r.block_of(w[static_cast<size_t>(i)]), i) << at;
      }
      int64_t block = 0;
      for (int64_t c = 0; c < k.v; ++c) {
        const StageRange x = chunk_range(r, c);
        const int64_t len = sizes[static_cast<size_t>(s)][static_cast<size_t>(c)];
        EXPECT_EQ(x.first_layer, w[static_cast<size_t>(block)]) << at << ", chunk " << c;
        EXPECT_EQ(x.num_layers(), len) << at << ", chunk " << c;
        EXPECT_EQ(r.chunk_block(c), block) << at << ", chunk " << c;
        // A slot's positions: a short first chunk ends at the slot's end,
        // every other chunk starts at its start.
        for (int64_t j = 0; j < len; ++j)
          EXPECT_EQ(r.slot_position(block + j), (c == 0 && s == 0 ? full - len : 0) + j) << at;
        block += len;
      }
      EXPECT_EQ(r.block_of(-1), -1);
      EXPECT_EQ(r.block_of(k.n), -1);
    }
  }
  // What does not cut: a chunk would be left without a layer.
  EXPECT_FALSE(layer_chunks(4, 2, 4).refusal.empty());
  EXPECT_FALSE(layer_chunks(9, 2, 4).refusal.empty());  // 8 chunks of 2, 7 short
  EXPECT_TRUE(layer_chunks(14, 2, 4).refusal.empty());
}

// The stage's own arithmetic under those chunks: two stages of two chunks
// each, run chunk by chunk in the model's order (forward through chunks
// 0, 1, 2, 3 of the model, backward back), give the one-stage model's loss
// and gradients; 6 layers (the first and the last chunk one short) and 7
// (the last), with and without full recomputation. Each block computes
// the same products on the same inputs, so all but the tied wte (its two
// halves summed on two stages) agree to the bit; wte to a relative 1e-12
// (double, the order of one addition).
TEST(GptModel, UnevenInterleavedChunksChainToTheWholeModel) {
  const std::vector<int32_t> tok = {1, 5, 10, 3, 0, 7, 7, 2};
  const std::vector<int32_t> tgt = {5, 10, 3, 9, 7, 7, 2, 4};
  const int64_t B = 2, pp = 2, v = 2;
  for (const int64_t n : {6, 7})
    for (const Recompute rc : {Recompute::kNone, Recompute::kFull}) {
      GptConfig cfg = tiny_config();
      cfg.n_layer = n;
      const double scale = 1.0 / static_cast<double>(B * cfg.seq_len);
      host::Context ctx;
      StageOptions one{B, 1}, two{B, 2};
      one.recompute = two.recompute = rc;
      HostGptStage<double> whole(ctx, cfg, partition_stage(cfg, 0, 1), one);
      whole.init_parameters(11);
      whole.zero_grads();
      whole.forward(0, tok.data(), tgt.data(), true, scale);
      const double loss = whole.take_loss_sum();
      whole.backward(0);
      std::vector<std::unique_ptr<HostGptStage<double>>> st;
      for (int64_t s = 0; s < pp; ++s) {
        st.push_back(std::make_unique<HostGptStage<double>>(ctx, cfg,
                                                           partition_stage(cfg, s, pp, 1, 0, v), two));
        st.back()->init_parameters(11);
        st.back()->zero_grads();
      }
      const int64_t A = st[0]->activation_size();
      const double* passed = nullptr;
      for (int c = 0; c < v; ++c)
        for (int64_t s = 0; s < pp; ++s) {
          if (passed != nullptr) std::memcpy(st[s]->input_buffer(c), passed, sizeof(double) * A);
          st[s]->forward(c, tok.data(), tgt.data(), true, scale, c);
          passed = st[s]->output(c);
        }
      const std::string at = std::to_string(n) + " layers, recompute " + name_of(rc);
      EXPECT_EQ(st[pp - 1]->take_loss_sum(), loss) << at;
      passed = nullptr;
      for (int c = v - 1; c >= 0; --c)
        for (int64_t s = pp - 1; s >= 0; --s) {
          if (passed != nullptr) std::memcpy(st[s]->output_grad_buffer(), passed, sizeof(double) * A);
          st[s]->backward(c, nullptr, c);
          passed = st[s]->input_grad();
        }
      const auto& wte = whole.table().at("wte");
      std::vector<double> wte_sum(static_cast<size_t>(wte.numel()), 0.0);
      for (int64_t s = 0; s < pp; ++s)
        for (const auto& spec : st[s]->table().specs()) {
          const double* g = st[s]->grads() + spec.offset;
          if (spec.name == "wte") {
            for (int64_t i = 0; i < spec.numel(); ++i) wte_sum[static_cast<size_t>(i)] += g[i];
            continue;
          }
          const double* ref = whole.grads() + whole.table().at(spec.name).offset;
          EXPECT_EQ(0, std::memcmp(g, ref, sizeof(double) * spec.numel())) << at << ": " << spec.name;
        }
      EXPECT_TRUE(all_close(wte_sum, std::vector<double>(whole.grads() + wte.offset,
                                                         whole.grads() + wte.offset + wte.numel()),
                            1e-15, 1e-12))
          << at;
    }
}

TEST(GptModel, PartitionSplitsLayersEvenly) {
  GptConfig cfg = tiny_config();
  cfg.n_layer = 7;
  const int64_t expect[3][2] = {{0, 3}, {3, 5}, {5, 7}};
  for (int64_t s = 0; s < 3; ++s) {
    const auto r = partition_stage(cfg, s, 3);
    EXPECT_EQ(r.first_layer, expect[s][0]);
    EXPECT_EQ(r.last_layer, expect[s][1]);
    EXPECT_EQ(r.has_embedding, s == 0);
    EXPECT_EQ(r.has_head, s == 2);
  }
}

}  // namespace
}  // namespace mpiformer::test
