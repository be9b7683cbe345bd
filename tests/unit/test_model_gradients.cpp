// The whole GPT stage in double: every parameter's gradient against central
// finite differences of the loss; gradient accumulation over micro-batches
// equals one larger batch; initialisation does not depend on the partition.
#include <cstring>

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
