// stage_footprint predicts, from the shapes alone, exactly the bytes a host
// GptStage allocates (the stage counts every allocation it makes), for
// whole models and pipeline splits, one or several activation slots, float
// and double; and it does not overflow on shapes no machine holds.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_stage.hpp"
#include "model/stage_footprint.hpp"

namespace mpiformer::test {
namespace {

template <class T>
void expect_exact(const GptConfig& cfg, int pp, int64_t micro_batch, int slots, int tp = 1) {
  host::Context ctx;
  for (int s = 0; s < pp * tp; ++s) {
    const StageRange range = partition_stage(cfg, s / tp, pp, tp, s % tp);
    const GptStage<host::Ops<T>> stage(ctx, cfg, range, micro_batch, slots);
    const StageFootprint f = stage_footprint(cfg, range, micro_batch, slots, sizeof(T), sizeof(T));
    EXPECT_EQ(f.total(), static_cast<double>(stage.allocated_bytes()))
        << "stage " << s / tp << " of " << pp << ", tensor rank " << s % tp << " of " << tp
        << ", " << slots << " slot(s), B " << micro_batch
        << ", " << sizeof(T) << "-byte elements";
    EXPECT_EQ(f.activations, slots * f.per_slot);
    EXPECT_EQ(f.parameters, static_cast<double>(stage.param_storage() * sizeof(T)));
    EXPECT_EQ(f.weight_copy, 0.0);  // one element type: no copy
  }
}

TEST(StageFootprint, EqualsWhatTheStageAllocates) {
  GptConfig odd;  // shapes that share no factor, so a swapped term shows
  odd.n_layer = 5;
  odd.n_head = 3;
  odd.n_embd = 24;
  odd.seq_len = 7;
  odd.vocab_size = 131;  // padded to 256
  for (int pp : {1, 2, 3, 5}) {
    expect_exact<float>(odd, pp, 3, 1);
    expect_exact<float>(odd, pp, 2, 4);
    expect_exact<double>(odd, pp, 1, 2);
  }
  GptConfig tiny;
  tiny.n_layer = 4;
  tiny.n_head = 4;
  tiny.n_embd = 128;
  tiny.seq_len = 64;
  tiny.vocab_size = 256;
  expect_exact<float>(tiny, 2, 16, 2);
  // Tensor-parallel slices: heads, channels and the vocabulary's shares
  // (4 x 128 padded rows for 131 tokens: the last ranks hold padding only).
  for (int tp : {3}) expect_exact<float>(odd, 2, 3, 2, tp);
  for (int tp : {2, 4}) {
    expect_exact<float>(tiny, 1, 4, 1, tp);
    expect_exact<double>(tiny, 2, 2, 3, tp);
  }
}

TEST(StageFootprint, MixedPrecisionCountsTheWeightCopy) {
  GptConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.seq_len = 8;
  cfg.vocab_size = 50;
  const StageRange all = partition_stage(cfg, 0, 1);
  const StageFootprint f32 = stage_footprint(cfg, all, 2, 1, 4, 4);
  const StageFootprint bf16 = stage_footprint(cfg, all, 2, 1, 2, 4);
  EXPECT_EQ(bf16.weight_copy, f32.parameters / 2);
  EXPECT_EQ(bf16.parameters, f32.parameters);
  EXPECT_LT(bf16.per_slot, f32.per_slot);
}

TEST(StageFootprint, ShapesNoMachineHoldsStayFinite) {
  GptConfig big;
  big.n_layer = 1024;
  big.n_head = 1024;
  big.n_embd = 65536;
  big.seq_len = 1 << 20;
  big.vocab_size = 1 << 24;
  const StageFootprint f = stage_footprint(big, partition_stage(big, 0, 1), 1000000000000LL, 8, 4, 4);
  EXPECT_GT(f.total(), 1e30);  // the attention scores alone: 1e12 x 1024 x 2^40 x 4 bytes x 8
  EXPECT_TRUE(std::isfinite(f.total()));
}

}  // namespace
}  // namespace mpiformer::test
