// The memory accounting (rank_memory) for a tiny model, against byte counts
// worked out by hand below, for zero 0-3 and each recompute mode; and the
// drops ZeRO promises on a larger model: AdamW moments ~1/dp at zero 1,
// gradients ~1/dp at zero 2, weights ~1/dp at zero 3 (plus two blocks).
#include <gtest/gtest.h>

#include <algorithm>

#include "train/backend_factory.hpp"
#include "temp_dir.hpp"
#include "tiny_deck.hpp"
#include "train/compressed_allreduce.hpp"
#include "train/zero_shards.hpp"

namespace mpiformer::test {
namespace {

// n_layer 3, n_head 2, n_embd 8, seq_len 4, vocab 11 (padded to 128);
// micro_batch 2, dp 2, one slot, fp32 on the host.
//
// Parameters, each tensor's storage rounded up to 16 floats:
//   wte 128 x 8 = 1024, wpe 4 x 8 = 32, ln_f 16 + 16;
//   a block: ln_1 16 + 16, c_attn 24 x 8 = 192 + 32, attn c_proj 64 + 16,
//   ln_2 16 + 16, c_fc 32 x 8 = 256 + 32, mlp c_proj 256 + 16 = 928;
//   n = 1024 + 32 + 3 x 928 + 32 = 3872 floats = 15488 bytes.
// Shards at dp 2 (cuts at rows): wte 512 | 512, wpe 16 | 16, each block
//   464 | 464 (the cut falls on a row of c_fc), ln_f.weight and .bias 16 | 0
//   (the cut would fall in the alignment gap after their 8 floats, which
//   goes with the next unit): rank 0's shard, the largest, is 1952 floats =
//   7808 bytes.
// Activations of one slot (BT = 8, C = 8; 4 bytes each):
//   residual stream 4 x 64 = 256 floats = 1024 bytes;
//   a block keeps 15 x 64 floats (3840 bytes), 4 x 8 statistics (128) and
//   its probabilities 2 x 2 x 4 x 4 = 64 floats (256): 4224 bytes;
//   tokens and targets 32 + 32; the head lnf 64 floats, logits 8 x 128,
//   losses and statistics 3 x 8: 4352 + 96.
// Scratch: dres, dln, datty 3 x 256; dqkv, d4, datt (3 + 4) x 256 + 256;
//   the loss sum 8: 2824 bytes.
// Communication (zero >= 1, host): MPI's temporaries of two reduce-scatters
//   in flight, of consecutive units (wte 1024 + wpe 32, two blocks
//   2 x 928, ...: the most is two blocks, 7424 bytes; at zero >= 2 the
//   blocks go apart from the rest, and two of them are still the most),
//   and a save's gather of the largest tensor (c_fc's 32 x 8 floats) for
//   its checksum, not at once (a save runs between steps): the larger,
//   7424 bytes; at zero >= 2 also two receive buffers
//   of a block's part.
GptConfig model() {
  GptConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 8;
  c.seq_len = 4;
  c.vocab_size = 11;
  return c;
}

RankMemory memory(int zero, Recompute recompute, int64_t dp = 2, GptConfig cfg = model()) {
  Deck d;
  d.model = cfg;
  d.train.micro_batch = 2;
  d.train.recompute = recompute;
  d.parallel.dp = dp;
  d.parallel.zero = zero;
  return rank_memory(d, BackendChoice{}, 0, SlotKinds::any(1));
}

TEST(MemoryAccounting, ExactBytesOfATinyModel) {
  const RankMemory z0 = memory(0, Recompute::kNone);
  EXPECT_EQ(z0.parameters(), 15488);
  EXPECT_EQ(z0.gradients(), 15488);
  EXPECT_EQ(z0.optimizer, 2 * 15488);
  EXPECT_EQ(z0.stage.per_slot, 1024 + 3 * 4224 + 64 + 4352 + 96);
  EXPECT_EQ(z0.stage.activations, z0.stage.per_slot);
  EXPECT_EQ(z0.stage.scratch, 2824);
  // MPI's temporaries of two all-reduces in flight: one 25 MiB bucket holds
  // the whole tiny stage.
  EXPECT_EQ(z0.comm, 2 * 15488);
  // A save's write and read-back (the deck saves at the end by default): a
  // piece and the staging buffer's part, each as long as the longest
  // tensor (c_fc's 32 x 8 floats), not the 16 MiB a piece may reach.
  EXPECT_EQ(z0.checkpoint_io, 2 * 256 * 4);
  {
    Deck d;
    d.model = model();
    d.train.micro_batch = 2;
    d.parallel.dp = 2;
    d.checkpoint.at_end = false;  // and no `every`: no save, no buffers
    EXPECT_EQ(rank_memory(d, BackendChoice{}, 0, SlotKinds::any(1)).checkpoint_io, 0);
  }
  EXPECT_EQ(z0.total(), 15488 * 4 + 18208 + 2824 + 2 * 15488 + 2 * 256 * 4);
  EXPECT_EQ(memory(0, Recompute::kNone, 1).comm, 0);  // one replica: no collective

  // zero 1: whole weights and gradients, shard of the moments; the
  // shard's reduced gradients are the whole gradients' own rows (reduced
  // in place), and in fp32 its master weights the whole weights' (no copy).
  const RankMemory z1 = memory(1, Recompute::kNone);
  EXPECT_EQ(z1.parameters(), 15488);
  EXPECT_EQ(z1.gradients(), 15488);
  EXPECT_EQ(z1.optimizer, 2 * 7808);
  EXPECT_EQ(z1.comm, 7424);
  // zero 2: the blocks' gradients in two windows of 928 floats, and the
  // vocabulary's through them in two pieces (wte's 1024 floats against a
  // 928-float window: 112 rows of 8, a multiple of 8 rows, then 16), so
  // of the gradients outside the blocks only wpe's and ln_f's stay whole.
  // The receive buffers hold the most a rank owns of a window: rank 0's
  // 512 floats of wte's first piece (a block's part is 464). The head's
  // input gradient adds up over the pieces in a float scratch of BT x C =
  // 64 floats.
  const RankMemory z2 = memory(2, Recompute::kNone);
  EXPECT_EQ(z2.gradients(), (32 + 2 * 928 + 32) * 4 + 7808);
  EXPECT_EQ(z2.parameters(), 15488);  // the weights stay whole
  EXPECT_EQ(z2.stage.scratch, 2824 + 64 * 4);
  EXPECT_EQ(z2.comm, 2 * 512 * 4 + 7424);
  // zero 3: the blocks' weights in two windows too, and the vocabulary's
  // weights through them in the same pieces.
  const RankMemory z3 = memory(3, Recompute::kNone);
  EXPECT_EQ(z3.parameters(), (32 + 2 * 928 + 32) * 4 + 7808);
  EXPECT_EQ(z3.gradients(), (32 + 2 * 928 + 32) * 4 + 7808);
  EXPECT_EQ(z3.stage.scratch, 2824 + 64 * 4);
  EXPECT_EQ(z3.total(), z3.parameters() + z3.gradients() + 2 * 7808 + 18208 + 2824 + 64 * 4 +
                           2 * 512 * 4 + 7424 + z3.checkpoint_io);

  // Recomputation: attention keeps one shared set of probabilities (256
  // bytes) instead of one per block; full keeps nothing of a block but its
  // input, plus one block's activations (4224) and output (256) shared.
  const RankMemory ra = memory(0, Recompute::kAttention);
  EXPECT_EQ(ra.stage.per_slot, 1024 + 3 * (4224 - 256) + 64 + 4352 + 96);
  EXPECT_EQ(ra.stage.scratch, 2824 + 256);
  const RankMemory rf = memory(0, Recompute::kFull);
  EXPECT_EQ(rf.stage.per_slot, 1024 + 64 + 4352 + 96);
  EXPECT_EQ(rf.stage.scratch, 2824 + 4224 + 256);
}

// What the stage and its shard allocate, counted as they allocate, is what
// the accounting predicts besides MPI's temporaries, for the rank of the
// group with the largest shard, at each zero stage and recompute mode.
TEST(MemoryAccounting, PredictsWhatTheStageAndItsShardAllocate) {
  GptConfig cfg = model();
  cfg.n_layer = 5;
  // MPI's temporaries (two consecutive units in flight: two blocks of 928
  // floats at tp 1; at tp 2 wte's 1024 floats, a rank's 128 of 256 padded
  // rows, and wpe's 32, but from zero 2, where wte's gradients go through
  // the windows in two pieces, two windows of a 512-float block) or the
  // save's gather
  // for a checksum (the largest tensor: c_fc's 256 floats; at tp 2 the
  // whole 256-float tensor gathered from its column slices and put in
  // order, twice), the larger (never held at once), are not buffers of
  // ours.
  for (const int tp : {1, 2}) {
    const StageRange range = partition_stage(cfg, 0, 1, tp, 0);
    for (int zero : {1, 2, 3}) {
      const double temporaries = tp == 1 ? 2 * 928 * 4 : zero >= 2 ? 2 * 512 * 4 : (1024 + 32) * 4;
      for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
        // What the stage and its shard allocate (`shard_only`: the shard's
        // alone), for the rank with the most.
        auto allocated = [&](auto ops, bool shard_only) {
          using Ops = decltype(ops);
          double largest = 0;
          for (int rank = 0; rank < 3; ++rank) {
            host::Context ctx;
            GptStage<Ops> stage(ctx, cfg, range, stage_options(2, SlotKinds::any(1), r, zero));
            ZeroShards<Ops> shard(stage, zero, 3, rank, OffloadSetup{});
            largest = std::max(largest, (shard_only ? 0.0 : static_cast<double>(stage.allocated_bytes())) +
                                            shard.allocated_bytes());
          }
          return largest;
        };
        Deck d;
        d.model = cfg;
        d.train.micro_batch = 2;
        d.train.recompute = r;
        d.parallel.dp = 3;
        d.parallel.tp = tp;
        d.parallel.zero = zero;
        const RankMemory m = rank_memory(d, BackendChoice{}, 0, SlotKinds::any(1));
        // (Less a save's buffers: the checkpoint's, not the stage's.)
        EXPECT_EQ(m.total() - m.checkpoint_io - temporaries, allocated(host::Ops<float>{}, false))
            << "tp " << tp << ", zero " << zero << ", recompute " << name_of(r);
        // bf16: the shard keeps no 16-bit copy at zero 1-2 and no reduced
        // gradients at zero 1 (rows of the stage's whole buffers); its
        // zero 2-3 receive buffers are the accounting's communication.
        BackendChoice bf16;
        bf16.precision = Precision::kBf16;
        d.train.precision = Precision::kBf16;
        const RankMemory h = rank_memory(d, bf16, 0, SlotKinds::any(1));
        const ParameterTable table(cfg, range);
        // (A window's part: a block's, or a vocabulary piece's.)
        const ShardPlan plan(table, StageLayout(table, range), 3, 0);
        const double receive =
            zero >= 2 ? 2.0 * 4 * static_cast<double>(plan.max_window_part(true)) : 0;
        EXPECT_EQ(h.shard_master + h.shard_gradients + h.optimizer + receive,
                  allocated(host::Ops<host::Bf16>{}, true))
            << "bf16, tp " << tp << ", zero " << zero << ", recompute " << name_of(r);
      }
    }
  }
}

// Expert parallelism (dp 4, ep 2): each rank holds half of the experts,
// and under ZeRO shards them over the 2 replicas holding the same ones
// (the rest over 4). What the stage and its shard allocate, for the rank
// with the largest shard, is the accounting less MPI's temporaries (the
// communication category but for zero 2-3's two receive buffers of a
// block's parts, which are ours).
TEST(MemoryAccounting, PredictsTheExpertParallelShards) {
  GptConfig cfg = model();
  cfg.experts = 4;
  cfg.top_k = 2;
  cfg.moe_every = 2;
  StageRange range = partition_stage(cfg, 0, 1);
  range.ep = 2;
  for (int zero : {1, 2, 3}) {
    double largest = 0, receive = 0;
    for (int rank = 0; rank < 4; ++rank) {
      range.ep_rank = rank % 2;
      host::Context ctx;
      const StageOptions o = stage_options(2, SlotKinds::any(1), Recompute::kNone, zero);
      GptStage<host::Ops<float>> stage(ctx, cfg, range, o);
      ZeroShards<host::Ops<float>> shard(stage, zero, 4, rank, OffloadSetup{});
      largest = std::max(largest, static_cast<double>(stage.allocated_bytes()) + shard.allocated_bytes());
      if (zero >= 2) receive = 2.0 * static_cast<double>(shard.plan().max_block_part()) * 4;
    }
    Deck d;
    d.model = cfg;
    d.train.micro_batch = 2;
    d.parallel.dp = 4;
    d.parallel.ep = 2;
    d.parallel.zero = zero;
    const RankMemory m = rank_memory(d, BackendChoice{}, 0, SlotKinds::any(1));
    EXPECT_EQ(m.total() - m.checkpoint_io - m.comm + receive, largest) << "zero " << zero;
  }
}

// ZeRO 3 sends the vocabulary through the block windows (zero_shards.hpp),
// zero 2 its gradients; here it fits one (the tests above cut it in
// pieces). At n_embd 16 (vocabulary 11, padded to 128): wte is 128 x 16 =
// 2048 floats; a block is ln_1 16 + 16, c_attn 48 x 16 = 768 + 48, attn
// c_proj 256 + 16, ln_2 16 + 16, c_fc 64 x 16 = 1024 + 64, mlp c_proj
// 1024 + 16 = 3280 floats, so wte fits. On one stage only wpe (4 x 16 =
// 64) and ln_f (16 + 16) stay outside the two windows, as gradients (and
// at zero 3 as weights). What the stage and its shard allocate, for the
// rank with the most, is the accounting less MPI's temporaries (as above), on one
// stage and on each of two (the tied copy on the second), at tp 1 and 2:
// at n_embd 32 (at tp 2 the vocabulary is padded to 256, 128 rows a rank,
// which at n_embd 16 would not fit a rank's block).
TEST(MemoryAccounting, ZeroTwoAndThreeSendTheVocabularyThroughTheWindows) {
  GptConfig cfg = model();
  cfg.n_embd = 16;
  {
    const StageRange all = partition_stage(cfg, 0, 1);
    const StageFootprint f =
        stage_footprint(cfg, all, stage_options(2, SlotKinds::any(1), Recompute::kNone, 3), 4, 4);
    EXPECT_EQ(f.gradients, (64 + 32 + 2 * 3280) * 4);
    EXPECT_EQ(f.weight_copy, (64 + 32 + 2 * 3280) * 4);
    // zero 2 sends wte's gradient through the windows, and keeps its
    // weights whole (fp32: the masters, which are the weights).
    const StageFootprint f2 =
        stage_footprint(cfg, all, stage_options(2, SlotKinds::any(1), Recompute::kNone, 2), 4, 4);
    EXPECT_EQ(f2.gradients, (64 + 32 + 2 * 3280) * 4);
    EXPECT_EQ(f2.weight_copy, static_cast<double>(ParameterTable(cfg, all).total_storage()) * 4);
  }
  cfg.n_embd = 32;
  for (int zero : {2, 3}) {
    for (int pp : {1, 2})
      for (int tp : {1, 2})
        for (int s = 0; s < pp; ++s) {
          const StageRange range = partition_stage(cfg, s, pp, tp, 0);
          double largest = 0, receive = 0;
          for (int rank = 0; rank < 3; ++rank) {
            host::Context ctx;
            const StageOptions o = stage_options(2, SlotKinds::any(1), Recompute::kNone, zero);
            GptStage<host::Ops<float>> stage(ctx, cfg, range, o);
            ASSERT_TRUE(stage.vocab_grads_windowed())
                << "zero " << zero << ", pp " << pp << ", tp " << tp << ", stage " << s;
            ASSERT_EQ(stage.vocab_weights_windowed(), zero == 3);
            ZeroShards<host::Ops<float>> shard(stage, zero, 3, rank, OffloadSetup{});
            largest = std::max(largest, static_cast<double>(stage.allocated_bytes()) +
                                            shard.allocated_bytes());
            receive = 2.0 * static_cast<double>(shard.plan().max_window_part(true)) * 4;
          }
          Deck d;
          d.model = cfg;
          d.train.micro_batch = 2;
          d.parallel.dp = 3;
          d.parallel.pp = pp;
          d.parallel.tp = tp;
          d.parallel.zero = zero;
          const RankMemory m = rank_memory(d, BackendChoice{}, s, SlotKinds::any(1));
          EXPECT_EQ(m.total() - m.checkpoint_io - m.comm + receive, largest)
              << "zero " << zero << ", pp " << pp << ", tp " << tp << ", stage " << s;
        }
  }
}

// bf16 with [train] offload: the shard's float masters leave with the
// moments (12 bytes an element), the 16-bit copy stays; what the stage and
// the shard allocate shrinks by that, and the accounting moves the same
// bytes to the disk (nvme) and adds the ring the blocks stream through.
TEST(MemoryAccounting, OffloadedMastersLeaveTheShardInMixedPrecision) {
  using Ops16 = host::Ops<host::Bf16>;
  GptConfig cfg = model();
  cfg.n_layer = 3;
  const StageRange range = partition_stage(cfg, 0, 1, 1, 0);
  TempDir dir;
  for (int zero : {1, 3}) {
    double allocated[2] = {0, 0}, shard = 0;
    for (int k = 0; k < 2; ++k) {
      OffloadSetup where;
      if (k == 1) where = OffloadSetup{Offload::kNvme, dir.file(""), 0, 1, 1024};
      host::Context ctx;
      GptStage<Ops16> stage(ctx, cfg, range,
                            stage_options(2, SlotKinds::any(1), Recompute::kNone, zero));
      ZeroShards<Ops16> opt(stage, zero, 3, 0, where);
      EXPECT_EQ(opt.moments().holds_masters(), k == 1);
      allocated[k] = static_cast<double>(stage.allocated_bytes()) + opt.allocated_bytes();
      shard = static_cast<double>(opt.state_size());
    }
    EXPECT_EQ(allocated[0] - allocated[1], 12 * shard) << "zero " << zero;
    Deck d;
    d.model = cfg;
    d.train.micro_batch = 2;
    d.train.precision = Precision::kBf16;
    d.parallel.dp = 3;
    d.parallel.zero = zero;
    BackendChoice bf16;
    bf16.precision = Precision::kBf16;
    const RankMemory none = rank_memory(d, bf16, 0, SlotKinds::any(1));
    d.train.offload = Offload::kNvme;
    d.train.offload_dir = dir.file("");
    const RankMemory nvme = rank_memory(d, bf16, 0, SlotKinds::any(1));
    // The accounting's is the group's largest shard.
    const ParameterTable table(cfg, range);
    shard = static_cast<double>(ShardPlan(table, StageLayout(table, range), 3, 0).max_shard_size());
    const double block = std::min(shard, static_cast<double>(offload_block_elements(d.train)));
    EXPECT_EQ(none.parameters() - nvme.parameters(), 4 * shard) << "zero " << zero;
    EXPECT_EQ(none.optimizer - nvme.optimizer, 8 * shard) << "zero " << zero;
    EXPECT_EQ(nvme.offload_disk, 12 * shard) << "zero " << zero;
    EXPECT_EQ(nvme.offload_buffers, 3 * 3 * block * 4) << "zero " << zero;
  }
}

// 16-bit gradients ([train] grad_dtype = bf16): what the stage (float
// windows for the blocks, whole float gradients of the tensors outside
// them) and the shard (at zero 1 the blocks' 16-bit sums; at zero 2-3 its
// float gradients and 16-bit receive and send buffers) allocate, for the rank with
// the most, is the accounting's less MPI's temporaries and a save's
// gathers (the host's communication category, not buffers of ours).
TEST(MemoryAccounting, PredictsSixteenBitGradients) {
  using Ops16 = host::Ops<host::Bf16>;
  GptConfig cfg = model();
  cfg.n_layer = 5;
  const StageRange range = partition_stage(cfg, 0, 1, 1, 0);
  const ParameterTable table(cfg, range);
  const ShardPlan plan(table, StageLayout(table, range), 3, 0);
  int64_t block = 0;
  for (const ShardUnit& u : plan.units())
    if (u.block >= 0) block = std::max(block, u.end - u.begin);
  BackendChoice bf16;
  bf16.precision = Precision::kBf16;
  for (int zero : {1, 2, 3}) {
    double largest = 0;
    for (int rank = 0; rank < 3; ++rank) {
      host::Context ctx;
      StageOptions o = stage_options(2, SlotKinds::any(1), Recompute::kNone, zero);
      o.window_grads = o.window_vocab_grads = true;  // as stage_options_of for 16-bit gradients
      GptStage<Ops16> stage(ctx, cfg, range, o);
      ASSERT_TRUE(stage.vocab_grads_windowed()) << "zero " << zero;
      ZeroShards<Ops16> shard(stage, zero, 3, rank, OffloadSetup{}, GradDtype::kBf16);
      largest = std::max(largest, static_cast<double>(stage.allocated_bytes()) + shard.allocated_bytes());
    }
    Deck d;
    d.model = cfg;
    d.train.micro_batch = 2;
    d.train.precision = Precision::kBf16;
    d.train.grad_dtype = GradDtype::kBf16;
    d.parallel.dp = 3;
    d.parallel.zero = zero;
    const RankMemory m = rank_memory(d, bf16, 0, SlotKinds::any(1));
    // (Zero 1 reduces the sums in place: no receive buffers.)
    const double ours = zero == 1 ? 0
                                  : 2.0 * 2 * static_cast<double>(plan.max_block_part()) +
                                        2.0 * 2 * static_cast<double>(block);
    // The accounting takes each array at the group's largest part; the
    // ranks' parts end at rows, so the rank with the most of one holds a
    // little less of another: never under, at most 0.2% over here.
    const double predicted = m.total() - m.checkpoint_io - (m.comm - ours);
    EXPECT_GE(predicted, largest) << "zero " << zero;
    EXPECT_LE(predicted, 1.002 * largest) << "zero " << zero;
  }
}

// Megatron-LM's distributed optimizer keeps, per parameter in bf16, the
// 16-bit weights (2 bytes) and the fp32 gradient buffer (4) whole, and the
// fp32 masters and two moments (12) sharded: 6 + 12/dp. Zero 1 keeps the
// same (its shard's gradients and 16-bit copy are rows of the whole
// buffers), zero 2 less. Model state only (weights, gradients, optimizer),
// GPT-2 124M's shape; within 0.2% (shards end at rows, the rank with the
// largest is counted, and the tensors' alignment padding counts too).
TEST(MemoryAccounting, ZeroOneCostsMegatronsBytesAParameterInBf16) {
  const GptConfig cfg = gpt2_124m_shape();
  BackendChoice bf16;
  bf16.precision = Precision::kBf16;
  for (int64_t dp : {2, 4, 8}) {
    Deck d;
    d.model = cfg;
    d.train.micro_batch = 1;
    d.train.precision = Precision::kBf16;
    d.parallel.dp = dp;
    const double n = static_cast<double>(
        ParameterTable(cfg, stage_range_of(d, 0, 0)).total_storage());
    auto state = [&](int zero) {
      d.parallel.zero = zero;
      const RankMemory m = rank_memory(d, bf16, 0, SlotKinds::any(1));
      return (m.parameters() + m.gradients() + m.optimizer) / n;
    };
    const double megatron = 6 + 12.0 / static_cast<double>(dp);
    EXPECT_NEAR(state(1), megatron, 2e-3 * megatron) << "dp " << dp;
    EXPECT_LT(state(2), state(1)) << "dp " << dp;
    // 16-bit gradients at zero 1 (Megatron's bf16 gradient buffer, 4 +
    // 12/dp): the blocks' and the vocabulary's gradients (wte, a third of
    // this shape, through the windows in pieces) in 2 bytes, reduced in
    // place; the small tensors outside the blocks (wpe, the final norm)
    // keep 4, and two blocks' float windows come on top.
    const ParameterTable table(cfg, stage_range_of(d, 0, 0));
    const StageLayout layout(table, stage_range_of(d, 0, 0));
    ASSERT_TRUE(layout.windows_vocab(true));
    const double narrow = static_cast<double>(layout.block_span() + layout.vocab_in.size());
    const double window = static_cast<double>(layout.block_storage());
    const double fp32_grads = state(1);
    d.train.grad_dtype = GradDtype::kBf16;
    const double expected =
        2 + (2 * narrow + 4 * (n - narrow) + 8 * window) / n + 12.0 / static_cast<double>(dp);
    EXPECT_NEAR(state(1), expected, 2e-3 * expected) << "dp " << dp;
    EXPECT_LT(state(1), fp32_grads - 1.4) << "dp " << dp;
    d.train.grad_dtype = GradDtype::kFp32;
  }
}

// [train] grad_compression: what the compressed all-reduce allocates (its
// residuals and wire buffers, counted as it allocates) is what the
// accounting adds (a GPU's: no host MPI temporaries in the way).
TEST(MemoryAccounting, CompressedGradientsAddTheirBuffers) {
  const GptConfig cfg = model();
  const StageRange range = partition_stage(cfg, 0, 1, 1, 0);
  const ParameterTable table(cfg, range);
  for (GradCompression c : {GradCompression::kBf16, GradCompression::kInt8}) {
    Deck d;
    d.model = cfg;
    d.train.micro_batch = 2;
    d.parallel.dp = 3;
    d.parallel.bucket_mb = 0.004;  // several buckets of the tiny stage
    BackendChoice gpu;
    gpu.device = Device::kCuda;
    const RankMemory plain = rank_memory(d, gpu, 0, SlotKinds::any(1));
    d.train.grad_compression = c;
    const RankMemory compressed = rank_memory(d, gpu, 0, SlotKinds::any(1));
    host::Context ctx;
    const auto buckets = gradient_buckets(table, d.parallel.bucket_mb * (1 << 20));
    ASSERT_GT(buckets.size(), 2u);
    CompressedAllReduce<host::Ops<float>> reduce(ctx, c, buckets, table.total_storage(), 3, 3);
    EXPECT_EQ(compressed.total() - plain.total(), reduce.allocated_bytes()) << name_of(c);
    EXPECT_GT(reduce.allocated_bytes(), 4.0 * static_cast<double>(table.total_storage()));
  }
}

TEST(MemoryAccounting, ZeroShrinksEachCategoryByTheDataParallelWidth) {
  const GptConfig cfg = gpt2_124m_shape();
  const double block = 12.0 * 768 * 768 * 4 + 13 * 768 * 4;  // a block's bytes, about
  for (int64_t dp : {2, 4, 8}) {
    const RankMemory z0 = memory(0, Recompute::kNone, dp, cfg);
    const RankMemory z1 = memory(1, Recompute::kNone, dp, cfg);
    const RankMemory z2 = memory(2, Recompute::kNone, dp, cfg);
    const RankMemory z3 = memory(3, Recompute::kNone, dp, cfg);
    const double n = z0.stage.parameters;  // the whole stage's bytes
    // Parts end at rows: shards within 0.1% of an even split.
    EXPECT_NEAR(z1.optimizer, z0.optimizer / dp, 1e-3 * z0.optimizer / dp) << dp;
    // fp32: the shard's masters are the stage's own weights, so zero 1
    // saves the moments' (dp - 1) / dp from dp = 2 on, and keeps no copy.
    EXPECT_EQ(z1.shard_master, 0.0) << dp;
    EXPECT_EQ(z1.parameters(), z0.parameters()) << dp;
    EXPECT_LT(z1.total(), z0.total()) << dp;
    EXPECT_EQ(z1.stage.gradients, z0.stage.gradients);
    // zero 2: whole gradients only outside the blocks and the vocabulary
    // (50,304 padded rows of 768, about 5.5 blocks, through the windows in
    // pieces), plus two windows.
    const double vocab = 50304.0 * 768 * 4;
    EXPECT_NEAR(z2.gradients(), n - 12 * block - vocab + 2 * block + n / dp, 1e-3 * n);
    EXPECT_NEAR(z2.parameters(), n, 1e-3 * n);
    EXPECT_LT(z2.total(), z1.total());
    // zero 3: the weights likewise.
    EXPECT_NEAR(z3.parameters(), n - 12 * block - vocab + 2 * block + n / dp, 1e-3 * n);
    EXPECT_LT(z3.total(), z2.total());
    EXPECT_EQ(z3.stage.activations, z0.stage.activations);
  }
}

// On a GPU the fused attention keeps each row's log-sum-exp (B x NH x T
// floats a layer) where the host keeps the probabilities (B x NH x T x T),
// and its backward's scratch shrinks alike; the device context adds its
// 32 MiB workspace. The tiny model above: 3 layers, B 2, NH 2, T 4, fp32.
TEST(MemoryAccounting, TheGpuKeepsAttentionsRowStatistics) {
  Deck d;
  d.model = model();
  d.train.micro_batch = 2;
  d.parallel.dp = 1;
  BackendChoice gpu;
  gpu.device = Device::kCuda;
  const RankMemory host = rank_memory(d, BackendChoice{}, 0, SlotKinds::any(1));
  const RankMemory cuda = rank_memory(d, gpu, 0, SlotKinds::any(1));
  const double probabilities = 2 * 2 * 4 * 4 * 4, statistics = 2 * 2 * 4 * 4;  // bytes a layer
  EXPECT_EQ(host.stage.per_slot - cuda.stage.per_slot, 3 * (probabilities - statistics));
  // The fused backward's scratch: each row's dot(dO, O) (B NH T floats),
  // dQ's float sum (B NH T hs, hs = 4) and a turn flag per 64-row tile
  // (B NH of them); the host's is the probabilities' gradient.
  const double fused_scratch = (2 * 2 * 4 + 2 * 2 * 4 * 4 + 2 * 2) * 4;
  EXPECT_EQ(host.stage.scratch - cuda.stage.scratch, probabilities - fused_scratch);
  EXPECT_EQ(cuda.workspace, 32.0 * (1 << 20));
  EXPECT_EQ(host.workspace, 0);
  d.train.recompute = Recompute::kAttention;  // the state is recomputed, not kept
  EXPECT_EQ(rank_memory(d, gpu, 0, SlotKinds::any(1)).stage.per_slot,
            cuda.stage.per_slot - 3 * statistics);
}

}  // namespace
}  // namespace mpiformer::test
