// stage_footprint predicts, from the shapes alone, exactly the bytes a host
// GptStage allocates (the stage counts every allocation it makes), for
// whole models and pipeline splits, one or several activation slots, float
// and double; and it does not overflow on shapes no machine holds.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/gpt_stage.hpp"
#include "model/stage_footprint.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace mpiformer::test {
namespace {

template <class T>
void expect_exact(const GptConfig& cfg, int pp, int64_t micro_batch, int slots, int tp = 1,
                  bool sequence_parallel = false, Recompute recompute = Recompute::kNone,
                  bool split_backward = false, int chunks = 1, int64_t cp = 1) {
  host::Context ctx;
  StageOptions o{micro_batch, slots};
  o.cp = cp;
  o.sequence_parallel = sequence_parallel;
  o.split_backward = split_backward;
  o.recompute = recompute;
  for (int s = 0; s < pp * tp; ++s) {
    const StageRange range = partition_stage(cfg, s / tp, pp, tp, s % tp, chunks);
    const GptStage<host::Ops<T>> stage(ctx, cfg, range, o);
    const StageFootprint f = stage_footprint(cfg, range, o, sizeof(T), sizeof(T));
    EXPECT_EQ(f.total(), static_cast<double>(stage.allocated_bytes()))
        << "stage " << s / tp << " of " << pp << ", tensor rank " << s % tp << " of " << tp
        << ", " << slots << " slot(s), B " << micro_batch << ", " << sizeof(T)
        << "-byte elements, sequence parallel " << sequence_parallel << ", recompute "
        << name_of(recompute) << ", split backward " << split_backward << ", chunks " << chunks
        << ", cp " << cp;
    EXPECT_EQ(f.activations, slots * f.per_slot);
    EXPECT_EQ(f.parameters, static_cast<double>(stage.param_storage() * sizeof(T)));
    EXPECT_EQ(f.weight_copy, 0.0);  // one element type: no copy
  }
}

// Shapes that share no factor, so a swapped term shows.
GptConfig odd_shapes(int64_t layers) {
  GptConfig odd;
  odd.n_layer = layers;
  odd.n_head = 3;
  odd.n_embd = 24;
  odd.seq_len = 7;
  odd.vocab_size = 131;  // padded to 256
  return odd;
}

TEST(StageFootprint, EqualsWhatTheStageAllocates) {
  const GptConfig odd = odd_shapes(5);
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
  // Interleaving: a slot holds one chunk's layers, the last stage one set
  // of head buffers and an inbox for its earlier chunks' gradients.
  for (Recompute r : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
    expect_exact<float>(tiny, 2, 4, 5, 1, false, r, false, 2);
    expect_exact<float>(tiny, 2, 4, 3, 2, true, r, false, 2);
  }
  GptConfig six = odd;
  six.n_layer = 6;
  expect_exact<float>(six, 3, 2, 4, 3, false, Recompute::kNone, false, 2);
  expect_exact<double>(six, 2, 1, 3, 1, false, Recompute::kNone, false, 3);
  // Chunks of unequal length (core/layer_chunks.hpp): a slot as long as
  // the longest chunk; 6 layers on 2 x 2 chunks (the first and the last
  // one short), 7 (the last), 10 on 3 x 2 (the first and the last).
  GptConfig seven = odd, ten = odd;
  seven.n_layer = 7;
  ten.n_layer = 10;
  expect_exact<float>(six, 2, 2, 4, 1, false, Recompute::kNone, false, 2);
  expect_exact<float>(seven, 2, 3, 3, 3, true, Recompute::kAttention, false, 2);
  expect_exact<double>(ten, 3, 1, 2, 1, false, Recompute::kFull, false, 2);
  // Tensor-parallel slices: heads, channels and the vocabulary's shares
  // (4 x 128 padded rows for 131 tokens: the last ranks hold padding only).
  for (int tp : {3}) expect_exact<float>(odd, 2, 3, 2, tp);
  for (int tp : {2, 4}) {
    expect_exact<float>(tiny, 1, 4, 1, tp);
    expect_exact<double>(tiny, 2, 2, 3, tp);
  }
  // Sequence parallelism: the rows held are a tp-th (odd: 3 x 7 rows over
  // 3 ranks), with each recomputation.
  for (const Recompute r : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
    expect_exact<float>(odd, 2, 3, 2, 3, true, r);
    expect_exact<double>(tiny, 2, 2, 3, 4, true, r);
  }
  // Split backward (zero-bubble schedules): the LayerNorms' weight
  // gradients wait in each slot, with and without sequence parallelism.
  for (const Recompute r : {Recompute::kNone, Recompute::kAttention}) {
    for (int pp : {1, 2, 3}) expect_exact<float>(odd, pp, 3, 2, 1, false, r, true);
    expect_exact<float>(odd, 2, 3, 2, 3, true, r, true);
    expect_exact<double>(tiny, 2, 2, 3, 4, true, r, true);
  }
}

// A slot that only ever holds the model's short first or last chunk
// allocates that chunk's layers alone (core/slot_kinds.hpp), with the
// slots as the trainer's schedules number them: the accounting still
// equals what the stage allocates, and the stage allocates less than
// whole-chunk slots by one short slot's shortfall for each such slot.
// 6 layers on 2 x 2 chunks (the first and last chunk one short), 10 on
// 3 x 2 (the same), 7 on 2 x 2 (the last alone), and 5 on 2 stages
// without interleaving, whose stages are cut to their layers already
// (no short chunk: nothing saved, nothing lost).
TEST(StageFootprint, SlotsOfAShortChunkHoldItsLayersAlone) {
  struct Case {
    int64_t layers;
    int pp, chunks;
  };
  int shortened = 0;
  for (const Case c : {Case{6, 2, 2}, Case{10, 3, 2}, Case{7, 2, 2}, Case{5, 2, 1}}) {
    const GptConfig cfg = odd_shapes(c.layers);
    const ScheduleKind kind = c.chunks > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
    for (int m : {c.pp, 2 * c.pp})
      for (int s = 0; s < c.pp; ++s) {
        const std::string where = std::to_string(c.layers) + " layers, stage " +
                                  std::to_string(s) + " of " + std::to_string(c.pp) + ", " +
                                  std::to_string(m) + " micro-batches";
        const StageRange range = partition_stage(cfg, s, c.pp, 1, 0, c.chunks);
        const SlotKinds kinds = slot_kinds(pipeline_schedule(kind, c.pp, s, m, c.chunks));
        host::Context ctx;
        const auto allocated = [&](const SlotKinds& k) {
          return static_cast<double>(
              GptStage<host::Ops<float>>(ctx, cfg, range, StageOptions{2, k}).allocated_bytes());
        };
        const StageFootprint f = stage_footprint(cfg, range, StageOptions{2, kinds}, 4, 4);
        EXPECT_EQ(f.total(), allocated(kinds)) << where;
        // Each kind of slot's shortfall, as the stage allocates one alone.
        const double whole = allocated(SlotKinds::any(1));
        const auto shortfall = [&](int both, int first, int last) {
          SlotKinds one = SlotKinds::any(1);
          one.both = both;
          one.first = first;
          one.last = last;
          return whole - allocated(one);
        };
        const double saved = kinds.both * shortfall(1, 0, 0) + kinds.first * shortfall(0, 1, 0) +
                             kinds.last * shortfall(0, 0, 1);
        EXPECT_EQ(allocated(SlotKinds::any(kinds.count)) - allocated(kinds), saved) << where;
        if ((range.first_short > 0 && kinds.both + kinds.first > 0) ||
            (range.last_short > 0 && kinds.both + kinds.last > 0)) {
          EXPECT_GT(saved, 0) << where;
          ++shortened;
        } else {
          EXPECT_EQ(saved, 0) << where;
        }
      }
  }
  EXPECT_GE(shortened, 6);  // stage 0 of each interleaved case at each m, and more
}

// The Llama family: RMSNorm's one statistic, the fused grouped-query qkv,
// SwiGLU's twice-wide projection and its separate activation gradient, the
// rotary table, no position table, an untied head on the last stage.
TEST(StageFootprint, EqualsWhatTheLlamaStageAllocates) {
  GptConfig c;
  c.family = ModelFamily::kLlama;
  c.n_layer = 4;
  c.n_head = 6;
  c.n_kv_head = 2;
  c.n_embd = 24;
  c.ffn_hidden = 40;
  c.seq_len = 7;
  c.vocab_size = 131;
  c.tie_embeddings = false;
  for (int pp : {1, 2, 4}) {
    expect_exact<float>(c, pp, 3, 2);
    expect_exact<double>(c, pp, 2, 1);
  }
  for (const Recompute r : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
    expect_exact<float>(c, 2, 3, 2, 2, false, r);
    expect_exact<float>(c, 2, 2, 2, 2, true, r);
    expect_exact<float>(c, 2, 4, 5, 1, false, r, false, 2);
  }
  expect_exact<float>(c, 2, 2, 2, 2, true, Recompute::kNone, true);
  // One kv head, held whole by both tensor ranks.
  GptConfig mq = c;
  mq.n_kv_head = 1;
  expect_exact<float>(mq, 2, 3, 2, 2);
  expect_exact<float>(mq, 2, 2, 2, 2, true, Recompute::kAttention);
  c.tie_embeddings = true;
  expect_exact<float>(c, 2, 3, 2);
}

// A Mixture of Experts: sparse blocks keep their dispatched rows and the
// router's decisions, and share the experts' scratch; dense and sparse
// blocks mixed (moe_every 2, under interleaving a slot position serving
// both), capacity or none, each family, tensor and sequence parallelism.
TEST(StageFootprint, EqualsWhatTheMoeStageAllocates) {
  GptConfig g = odd_shapes(4);
  g.experts = 5;
  g.top_k = 2;
  g.moe_every = 2;
  for (const double cf : {1.25, 0.0, 3.0}) {
    g.capacity_factor = cf;
    for (int pp : {1, 2}) expect_exact<float>(g, pp, 3, 2);
    for (const Recompute r : {Recompute::kNone, Recompute::kAttention, Recompute::kFull})
      expect_exact<double>(g, 1, 3, 2, 3, true, r);
  }
  g.moe_every = 3;  // layers 0 and 3 sparse: chunk 0's position 0, chunk 1's position 1
  expect_exact<float>(g, 1, 2, 3, 1, false, Recompute::kNone, false, 2);
  // Unequal chunks: 6 layers on 2 x 2, stage 0's chunks [0, 1) (sparse,
  // at a slot's position 1) and [3, 5) (sparse, then dense at position 1).
  GptConfig uneven = g;
  uneven.n_layer = 6;
  expect_exact<float>(uneven, 2, 2, 3, 1, false, Recompute::kNone, false, 2);
  // Expert parallelism: each rank holds E / ep experts and the rows every
  // rank of its group may send them (under split backward their output
  // gradients too, left for W).
  for (const int64_t ep : {5}) {
    for (const double cf : {1.25, 0.0}) {
      GptConfig p = g;
      p.capacity_factor = cf;
      host::Context ctx;
      for (const bool split : {false, true}) {
        StageOptions o{3, 2};
        o.split_backward = split;
        for (int64_t r = 0; r < ep; r += 2) {
          StageRange range = partition_stage(p, 0, 1);
          range.ep = ep;
          range.ep_rank = r;
          const GptStage<host::Ops<float>> stage(ctx, p, range, o);
          EXPECT_EQ(stage_footprint(p, range, o, 4, 4).total(),
                    static_cast<double>(stage.allocated_bytes()))
              << "ep " << ep << " rank " << r << " capacity factor " << cf << " split " << split;
        }
      }
    }
  }
  GptConfig l = g;
  l.family = ModelFamily::kLlama;
  l.n_kv_head = 1;
  l.ffn_hidden = 42;
  l.tie_embeddings = false;
  l.moe_every = 1;
  for (const Recompute r : {Recompute::kNone, Recompute::kFull}) {
    expect_exact<float>(l, 2, 3, 2, 3, false, r);
    expect_exact<float>(l, 1, 3, 2, 3, true, r);
  }
}

// Sequence parallelism divides what a block keeps on the rows (ln1, res2,
// ln2, their statistics) and the residual stream by tp; what is split by
// channels already (qkv, atty, fch, GELU, attention's state) is unchanged.
// Context parallelism: a cp-th of each sequence's rows, their positions,
// each query row's log-sum-exp instead of the probabilities, no attention
// scratch of the stage's, the rotary table over the whole sequence.
TEST(StageFootprint, EqualsWhatTheContextParallelStageAllocates) {
  GptConfig g;
  g.n_layer = 4;
  g.n_head = 3;
  g.n_embd = 24;
  g.seq_len = 12;
  g.vocab_size = 131;
  GptConfig l = g;
  l.family = ModelFamily::kLlama;
  l.n_head = 6;
  l.n_kv_head = 2;
  l.ffn_hidden = 40;
  l.tie_embeddings = false;
  for (int64_t cp : {2, 3, 6}) {
    for (const Recompute r : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
      expect_exact<float>(g, 2, 3, 2, 1, false, r, false, 1, cp);
      expect_exact<double>(l, 2, 2, 3, 2, false, r, false, 1, cp);
      expect_exact<float>(l, 1, 2, 2, 2, true, r, false, 1, cp);
    }
    expect_exact<float>(g, 2, 3, 3, 3, true, Recompute::kNone, true, 2, cp);
  }
  // A Mixture of Experts: the router's scratch holds the context group's
  // counts too.
  GptConfig m = g;
  m.experts = 5;
  m.top_k = 2;
  for (int64_t cp : {2, 3}) {
    expect_exact<float>(m, 1, 2, 2, 1, false, Recompute::kNone, false, 1, cp);
    expect_exact<double>(m, 2, 3, 2, 3, true, Recompute::kAttention, false, 1, cp);
  }
}

TEST(StageFootprint, SequenceParallelismDividesTheRowsKept) {
  GptConfig cfg;
  cfg.n_layer = 4;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.seq_len = 32;
  cfg.vocab_size = 100;
  const int64_t B = 2, BT = B * cfg.seq_len, C = cfg.n_embd, tp = 4;
  const StageRange middle = partition_stage(cfg, 1, 3, tp, 0);  // blocks only
  const int64_t L = middle.num_layers();
  ASSERT_TRUE(L > 0 && !middle.has_embedding && !middle.has_head);
  StageOptions o{B, 1};
  const StageFootprint plain = stage_footprint(cfg, middle, o, 4, 4);
  o.sequence_parallel = true;
  const StageFootprint sp = stage_footprint(cfg, middle, o, 4, 4);
  // Per block: 3 row activations of C and 4 row statistics; plus L + 1
  // residuals.
  const double rows_saved = static_cast<double>(BT - BT / tp);
  EXPECT_EQ(plain.per_slot - sp.per_slot, rows_saved * 4 * ((L + 1) * C + L * (3 * C + 4)));
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
