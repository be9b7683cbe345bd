// The whole GPT stage in double: every parameter's gradient against central
// finite differences of the loss; gradient accumulation over micro-batches
// equals one larger batch; initialisation does not depend on the partition.
#include <cstring>

#include "model/gpt_stage.hpp"
#include "reference.hpp"

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

void randomise(HostGptStage<double>& stage, unsigned seed) {
  // Larger than GPT-2's init so every nonlinearity is exercised.
  for (const auto& s : stage.table().specs()) {
    const auto r = random_vector(static_cast<size_t>(s.numel()), seed++, 0.3);
    std::memcpy(stage.params() + s.offset, r.data(), sizeof(double) * r.size());
  }
}

TEST(GptModel, EveryParameterGradientMatchesFiniteDifferences) {
  const GptConfig cfg = tiny_config();
  const int64_t B = 2, T = cfg.seq_len;
  host::Context ctx;
  HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), B, 1);
  randomise(stage, 100);
  const std::vector<int32_t> tok = {1, 5, 10, 3, 0, 7, 7, 2};
  const std::vector<int32_t> tgt = {5, 10, 3, 9, 7, 7, 2, 4};
  const double scale = 1.0 / static_cast<double>(B * T);

  stage.zero_grads();
  stage.forward(0, tok.data(), tgt.data(), true, scale);
  stage.backward(0);
  stage.take_loss_sum();

  int64_t checked = 0;
  for (const auto& s : stage.table().specs()) {
    std::vector<double> x(stage.params() + s.offset, stage.params() + s.offset + s.numel());
    auto loss = [&] {
      std::memcpy(stage.params() + s.offset, x.data(), sizeof(double) * x.size());
      stage.forward(0, tok.data(), tgt.data(), false, 0.0);
      return scale * stage.take_loss_sum();
    };
    const auto want = finite_difference(x, loss, 1e-5);
    loss();  // restore the unperturbed values
    const std::vector<double> got(stage.grads() + s.offset, stage.grads() + s.offset + s.numel());
    // h = 1e-5 in double: truncation ~h^2 * |f'''| ~ 1e-10, rounding
    // ~1e-16 * |L| / h ~ 1e-11; 1e-7 absolute leaves a wide margin while a
    // wrong term (typically >= 1e-3 here) still fails.
    EXPECT_TRUE(all_close(got, want, 1e-7, 1e-5)) << s.name;
    checked += s.numel();
  }
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
  randomise(whole, 200);
  whole.zero_grads();
  whole.forward(0, tok.data(), tgt.data(), true, scale);
  const double loss_whole = whole.take_loss_sum();
  whole.backward(0);

  HostGptStage<double> split(ctx, cfg, partition_stage(cfg, 0, 1), 1, 1);
  randomise(split, 200);
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
