// The planner's pieces against references that share no code with them:
//  - stage_work's FLOPs equal the hand count of GPT-2's products (per
//    token and layer 24 C^2 forward, the head 2 C Vp, attention 4 T C per
//    token and layer over the full T x T; backward twice forward), summed
//    over a tensor group's slices, and full recomputation adds exactly one
//    more forward of the blocks; its tensor all-reduces are Megatron's
//    count (2 per block each way, the head's, the cross-entropy's 2; the
//    embedding's token rows gathered instead of summed). Exact in doubles (integers far below 2^53).
//  - machine files: a hand-written one reads as written, calibrate's TOML
//    reads back to the same values, and bad ones are refused naming the
//    file and the key.
//  - plan: every layout it lists is valid for the deck and the ranks, its
//    memory is the run's own accounting (rank_memory) to the byte, the
//    list is fastest first, a 1-stage layout has no bubble; and a model
//    that fits nowhere is refused with what it needs and what there is.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <utility>

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/layer_chunks.hpp"
#include "machine_file.hpp"
#include "model/parameter_table.hpp"
#include "model/shard_plan.hpp"
#include "model/stage_layout.hpp"
#include "model/stage_work.hpp"
#include "plan/gemm_tiles.hpp"
#include "plan/layout_search.hpp"
#include "plan/memory_report.hpp"
#include "plan/plan_explain.hpp"
#include "plan/rank_memory.hpp"
#include "plan/stage_tables.hpp"
#include "tiny_deck.hpp"

namespace mpiformer::test {
namespace {

double flops(const std::vector<WorkItem>& items) {
  double f = 0;
  for (const WorkItem& w : items) f += w.flops;
  return f;
}

TEST(StageWork, FlopsAreGpt2sProductsOverEveryTensorSlice) {
  const GptConfig cfg{3, 4, 64, 32, 300};
  const double B = 2, T = 32, C = 64, L = 3;
  for (int64_t tp : {1, 2, 4}) {
    const double Vp = static_cast<double>(cfg.padded_vocab(tp));
    double fwd = 0, bwd = 0;
    for (int64_t r = 0; r < tp; ++r) {
      const StageRange range = partition_stage(cfg, 0, 1, tp, r);
      const StageWork w = stage_work(cfg, range, 2, Recompute::kNone, 4);
      fwd += flops(w.forward);
      bwd += flops(w.backward);
    }
    const double want = B * T * (L * 24 * C * C + 2 * C * Vp) + B * L * 4 * T * T * C;
    EXPECT_EQ(fwd, want) << "tp " << tp;
    EXPECT_EQ(bwd, 2 * want) << "tp " << tp;
  }
  const StageRange all = partition_stage(cfg, 0, 1);
  const double plain = flops(stage_work(cfg, all, 2, Recompute::kNone, 4).backward);
  const double full = flops(stage_work(cfg, all, 2, Recompute::kFull, 4).backward);
  EXPECT_EQ(full - plain, B * T * L * 24 * C * C + B * L * 4 * T * T * C);
  const double attn = flops(stage_work(cfg, all, 2, Recompute::kAttention, 4).backward);
  EXPECT_EQ(attn - plain, B * L * 4 * T * T * C);
}

// Llama's products by hand: per token and layer q (C x C), k and v (2 x
// C x K), the output projection (C x C), gate and up (2 x C x F) and down
// (F x C), 2 FLOPs a multiply-add; attention over every query head as
// GPT-2's; the head 2 C Vp.
TEST(StageWork, FlopsAreLlamasProductsOverEveryTensorSlice) {
  GptConfig cfg{3, 4, 64, 32, 300};
  cfg.family = ModelFamily::kLlama;
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 96;
  cfg.tie_embeddings = false;
  const double B = 2, T = 32, C = 64, L = 3, K = 32, F = 96;
  for (int64_t tp : {1, 2}) {
    const double Vp = static_cast<double>(cfg.padded_vocab(tp));
    double fwd = 0, bwd = 0;
    for (int64_t r = 0; r < tp; ++r) {
      const StageWork w = stage_work(cfg, partition_stage(cfg, 0, 1, tp, r), 2, Recompute::kNone, 4);
      fwd += flops(w.forward);
      bwd += flops(w.backward);
    }
    const double per_layer = 2 * (C * C + 2 * C * K + C * C + 2 * C * F + F * C);
    const double want = B * T * (L * per_layer + 2 * C * Vp) + B * L * 4 * T * T * C;
    EXPECT_EQ(fwd, want) << "tp " << tp;
    EXPECT_EQ(bwd, 2 * want) << "tp " << tp;
  }
}

// A Mixture of Experts by hand: each token's top k experts' MLPs (GELU:
// 2 x 2 C 4C a token and expert) and the router (2 C E), per sparse layer
// (layers 0 and 2 of 3); balanced and without drops (a capacity factor of
// 2 leaves room). Under expert parallelism the same FLOPs on every rank,
// and four all-to-alls a sparse layer of each rank's routed rows.
TEST(StageWork, FlopsOfAMixtureOfExpertsAndItsAllToAlls) {
  GptConfig cfg{3, 4, 64, 32, 300};
  cfg.experts = 4;
  cfg.top_k = 2;
  cfg.moe_every = 2;
  cfg.capacity_factor = 2.0;
  const double B = 2, T = 32, C = 64, L = 3, E = 4, K = 2, Vp = static_cast<double>(cfg.padded_vocab());
  const double dense_mlp = 2 * 2 * C * 4 * C;
  const double attention_part = 2 * (3 * C * C + C * C);
  const double want = B * T * (L * attention_part + 1 * dense_mlp + 2 * (K * dense_mlp + 2 * C * E) +
                               2 * C * Vp) +
                      B * L * 4 * T * T * C;
  const StageRange all = partition_stage(cfg, 0, 1);
  const StageWork w = stage_work(cfg, all, 2, Recompute::kNone, 4);
  EXPECT_EQ(flops(w.forward), want);
  EXPECT_EQ(flops(w.backward), 2 * want);
  EXPECT_TRUE(w.ep_forward.empty() && w.ep_backward.empty());
  // Balanced, each rank's experts compute as many rows as its tokens send
  // out: every rank's FLOPs are one rank's without expert parallelism.
  for (int64_t ep : {2, 4}) {
    for (int64_t r = 0; r < ep; ++r) {
      StageRange range = all;
      range.ep = ep;
      range.ep_rank = r;
      const StageWork x = stage_work(cfg, range, 2, Recompute::kNone, 4);
      EXPECT_EQ(flops(x.forward), want) << "ep " << ep;
      EXPECT_EQ(flops(x.backward), 2 * want) << "ep " << ep;
      ASSERT_EQ(x.ep_forward.size(), 4u);  // 2 sparse layers, out and back
      ASSERT_EQ(x.ep_backward.size(), 4u);
      for (double bytes : x.ep_forward) EXPECT_EQ(bytes, B * T * K * C * 4);
    }
  }
  // The busiest rank of an ep 2 group priced at 1.5 x its fair share: its
  // 2 experts' GEMMs (64 rows each, balanced) and the all-to-alls grow by
  // half; at 3 x they stop at what the group can send it (its experts'
  // capacity: 2 ranks x 2 sequences x 32 = 128 rows each, 2 x); at ep 1
  // imbalance moves rows between experts of the same rank (no change).
  const double expert_gemms = 2 * 2 * 2 * 64 * (C * 4 * C + 4 * C * C);  // 2 sparse layers
  StageRange two = all;
  two.ep = 2;
  const StageWork even = stage_work(cfg, two, 2, Recompute::kNone, 4);
  for (const auto& [imbalance, grows] : {std::pair{1.5, 0.5}, std::pair{3.0, 1.0}}) {
    const StageWork busy = stage_work(cfg, two, 2, Recompute::kNone, 4, false, false, imbalance);
    EXPECT_EQ(flops(busy.forward) - flops(even.forward), grows * expert_gemms) << imbalance;
    EXPECT_EQ(flops(busy.backward) - flops(even.backward), 2 * grows * expert_gemms) << imbalance;
    ASSERT_EQ(busy.ep_forward.size(), even.ep_forward.size());
    for (size_t i = 0; i < busy.ep_forward.size(); ++i)
      EXPECT_EQ(busy.ep_forward[i], (1 + grows) * even.ep_forward[i]) << imbalance;
    EXPECT_EQ(flops(stage_work(cfg, all, 2, Recompute::kNone, 4, false, false, imbalance).forward),
              want);
  }
  // Context parallelism: a rank routes a cp-th of each sequence's tokens,
  // so every product but attention's, the experts' included, and the
  // all-to-alls are a cp-th of one rank's, at a capacity that limits
  // nothing (factor 2) and at one that does (0.5: 8 places per expert of
  // a sequence's 64 assignments; a context rank's balanced share is 4).
  auto products = [](const StageWork& w) {
    double f = 0;
    for (const WorkItem& x : w.forward)
      if (x.kernel != Kernel::kAttention) f += x.flops;
    return f;
  };
  for (const double factor : {2.0, 0.5}) {
    GptConfig c = cfg;
    c.capacity_factor = factor;
    const StageWork ring = stage_work(c, two, 2, Recompute::kNone, 4, false, false, 1.0, 2);
    const StageWork one_ep = stage_work(c, two, 2, Recompute::kNone, 4);
    EXPECT_DOUBLE_EQ(products(ring), products(one_ep) / 2) << factor;
    ASSERT_EQ(ring.ep_forward.size(), one_ep.ep_forward.size());
    for (size_t i = 0; i < ring.ep_forward.size(); ++i)
      EXPECT_DOUBLE_EQ(ring.ep_forward[i], one_ep.ep_forward[i] / 2) << factor;
  }
}

TEST(StageWork, TensorAllReducesAreMegatronsCount) {
  const GptConfig cfg{4, 4, 64, 32, 300};
  const double BTC = 2 * 32 * 64 * 4.0;
  for (int stage = 0; stage < 2; ++stage) {
    const StageRange range = partition_stage(cfg, stage, 2, 2, 0);
    const StageWork w = stage_work(cfg, range, 2, Recompute::kNone, 4);
    const size_t blocks = static_cast<size_t>(range.num_layers());
    // First stage: the embedding's token rows gathered (not summed); last:
    // the cross-entropy's row maxima and sums forward, the head's input
    // gradient backward.
    EXPECT_EQ(w.tp_forward.size(), 2 * blocks + (stage == 0 ? 1 : 2));
    const auto gathers = std::count_if(w.tp_forward.begin(), w.tp_forward.end(), [](const auto& c) {
      return c.kind == TensorCollective::kAllgather;
    });
    EXPECT_EQ(gathers, stage == 0 ? 1 : 0);
    if (stage == 0) {
      EXPECT_EQ(w.tp_forward.front().kind, TensorCollective::kAllgather);
      EXPECT_EQ(w.tp_forward.front().bytes, BTC);
    }
    EXPECT_EQ(w.tp_backward.size(), 2 * blocks + (stage == 1 ? 1 : 0));
    EXPECT_EQ(w.tp_backward.front().bytes, BTC);
    EXPECT_EQ(w.message_bytes, BTC);
  }
  EXPECT_TRUE(stage_work(cfg, partition_stage(cfg, 0, 1), 2, Recompute::kNone, 4).tp_forward.empty());
}

// Sequence parallelism (Korthikanti et al.): each forward all-reduce
// becomes a reduce-scatter and an all-gather of the same buffer (the same
// ring volume); backward also gathers each LayerNorm's output again (what
// is kept is its rows) and the gradient entering each row-parallel GEMM,
// and sums the LayerNorms' weight gradients. Messages between stages are
// the rows held; the GEMMs do not change.
TEST(StageWork, SequenceParallelismSplitsEachAllReduce) {
  const GptConfig cfg{4, 4, 64, 32, 300};
  const double BTC = 2 * 32 * 64 * 4.0, tp = 2;
  auto count = [](const std::vector<TensorCollective>& list, TensorCollective::Kind k) {
    size_t n = 0;
    for (const auto& c : list) n += c.kind == k && c.bytes == 2 * 32 * 64 * 4.0;
    return n;
  };
  for (int stage = 0; stage < 2; ++stage) {
    const StageRange range = partition_stage(cfg, stage, 2, 2, 0);
    const StageWork plain = stage_work(cfg, range, 2, Recompute::kNone, 4);
    const StageWork sp = stage_work(cfg, range, 2, Recompute::kNone, 4, true);
    const size_t blocks = static_cast<size_t>(range.num_layers());
    const bool first = stage == 0, last = stage == 1;
    using TC = TensorCollective;
    EXPECT_EQ(count(sp.tp_forward, TC::kReduceScatter), 2 * blocks + (first ? 1 : 0));
    EXPECT_EQ(count(sp.tp_forward, TC::kAllgather), 2 * blocks + (last ? 1 : 0));
    EXPECT_EQ(count(sp.tp_backward, TC::kReduceScatter), 2 * blocks + (last ? 1 : 0));
    EXPECT_EQ(count(sp.tp_backward, TC::kAllgather), 4 * blocks + (last ? 1 : 0) + (first ? 1 : 0));
    EXPECT_EQ(count(sp.tp_forward, TC::kAllreduce) + count(sp.tp_backward, TC::kAllreduce), 0u);
    // The LayerNorms' gradients: two per block, the final one.
    size_t small = 0;
    for (const auto& c : sp.tp_backward) small += c.kind == TC::kAllreduce;
    EXPECT_EQ(small, blocks + (last ? 1 : 0));
    EXPECT_EQ(sp.message_bytes, BTC / tp);
    EXPECT_EQ(flops(sp.forward), flops(plain.forward));
    EXPECT_EQ(flops(sp.backward), flops(plain.backward));
  }
}

const char* kHandWritten = R"(
[machine]
name = "two GPUs"
device = "cuda"
devices_per_node = 2
memory_gib = 80
peak_tflops = 312
[compute]
matmul_tflops = 250
memory_gbs = 1500
kernel_gbs = { gelu = 1000 }
[intra]
latency_us = 10
bandwidth_gbs = 200
sendrecv = { latency_us = 5, bandwidth_gbs = 100 }
)";

TEST(MachineFile, AHandWrittenFileReadsAsWritten) {
  const MachineSpec m = parse_machine(kHandWritten, "two.toml");
  EXPECT_EQ(m.name, "two GPUs");
  EXPECT_EQ(m.device, Device::kCuda);
  EXPECT_EQ(m.devices_per_node, 2);
  EXPECT_EQ(m.memory, 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(m.peak_flops, 312e12);
  EXPECT_DOUBLE_EQ(m.attention_flops, 250e12);  // the matmul rate where not given
  EXPECT_DOUBLE_EQ(m.kernel_bandwidth.at("gelu"), 1000e9);
  EXPECT_DOUBLE_EQ(m.intra.allreduce.latency, 10e-6);
  EXPECT_DOUBLE_EQ(m.intra.sendrecv.bandwidth, 100e9);
  EXPECT_FALSE(m.has_inter);
  EXPECT_DOUBLE_EQ(m.inter.allgather.bandwidth, 200e9);  // one node: inter is intra
  EXPECT_FALSE(m.precision.has_value());  // the file does not say
  // No all-to-all given: the all-gather's (here the link's base rate).
  EXPECT_DOUBLE_EQ(m.intra.alltoall.latency, m.intra.allgather.latency);
  EXPECT_DOUBLE_EQ(m.intra.alltoall.bandwidth, m.intra.allgather.bandwidth);
}

// Every non-GEMM kernel's rate, forward and backward, set to `rate`.
void set_elementwise_rates(MachineSpec& m, double rate) {
  for (Kernel k : {Kernel::kLayernorm, Kernel::kGelu, Kernel::kResidual, Kernel::kCrossentropy,
                   Kernel::kEmbedding})
    for (bool backward : {false, true}) m.kernel_bandwidth[kernel_rate_name(k, backward)] = rate;
}

// A hand-written file prices each GEMM by its shape: the slower of the
// large-GEMM rate and its operands' bytes at the memory's (a roofline).
// With the FLOPs free and every other kernel free, a stage's forward is its
// matmuls' bytes at the memory bandwidth, counted here from the shapes
// (input, weight, output of each: qkv, projection, fc, fc projection, head).
TEST(MachineFile, GemmsAreBoundByTheirBytesWhereNoShapeIsMeasured) {
  MachineSpec m = parse_machine(kHandWritten, "two.toml");
  m.matmul_flops = 1e30;
  m.attention_flops = 1e30;
  m.memory_bandwidth = 1e9;
  set_elementwise_rates(m, 1e30);
  const GptConfig cfg{2, 2, 16, 32, 100};
  const double BT = 4 * 32, C = 16, V = static_cast<double>(cfg.padded_vocab(1)), act = 2;
  auto bytes = [&](double k, double n) { return act * (BT * k + k * n + BT * n); };
  const double want = 2 * (bytes(C, 3 * C) + bytes(C, C) + bytes(C, 4 * C) + bytes(4 * C, C)) +
                      bytes(C, V);
  const auto [fwd, bwd] = kernel_seconds(m, cfg, partition_stage(cfg, 0, 1), 4, Recompute::kNone, act);
  EXPECT_NEAR(fwd, want / 1e9, 1e-12 * want);
  EXPECT_GT(bwd, fwd);
  // A wide model's products (over a thousand FLOPs a byte) on the file's
  // own rates: the FLOPs bound them, so the memory's rate does not move
  // their price (the other kernels' rates held).
  m = parse_machine(kHandWritten, "two.toml");
  set_elementwise_rates(m, 1e12);
  const GptConfig wide{1, 32, 4096, 2048, 50257};
  const StageRange all = partition_stage(wide, 0, 1);
  const auto at_file_rate = kernel_seconds(m, wide, all, 1, Recompute::kNone, 2);
  m.memory_bandwidth = 1e30;
  const auto at_infinite = kernel_seconds(m, wide, all, 1, Recompute::kNone, 2);
  EXPECT_DOUBLE_EQ(at_file_rate.first, at_infinite.first);
  EXPECT_DOUBLE_EQ(at_file_rate.second, at_infinite.second);
}

// The tile model against a schedule played out: every tile of the padded
// grid handed to the next free multiprocessor, each tile taking its area
// over its rate; the efficiency is the output's area over the
// multiprocessors' time. The best tile and orientation wins.
double scheduled_efficiency(const MachineSpec& m, int64_t rows, int64_t cols) {
  double best = 0;
  for (const MatmulTile& t : m.matmul_tiles) {
    for (int flip = 0; flip < 2; ++flip) {
      const int64_t r = flip ? t.cols : t.rows, c = flip ? t.rows : t.cols;
      std::vector<double> busy(static_cast<size_t>(m.multiprocessors), 0.0);
      for (int64_t i = 0; i < rows; i += r) {
        for (int64_t j = 0; j < cols; j += c) {
          *std::min_element(busy.begin(), busy.end()) += static_cast<double>(r * c) / t.rate;
        }
      }
      const double makespan = *std::max_element(busy.begin(), busy.end());
      best = std::max(best, static_cast<double>(rows * cols) / (makespan * m.multiprocessors));
    }
  }
  return best;
}

TEST(MachineFile, GemmTilesPriceAShapesWavesAndPadding) {
  std::string text = kHandWritten;
  text.replace(text.find("memory_gbs"), 0,
               "multiprocessors = 4\nmatmul_tiles = [{ rows = 128, cols = 256 }, "
               "{ rows = 64, cols = 64, rate = 0.5 }]\n");
  const MachineSpec m = parse_machine(text, "tiles.toml");
  ASSERT_EQ(m.multiprocessors, 4);
  ASSERT_EQ(m.matmul_tiles.size(), 2u);
  EXPECT_EQ(m.matmul_tiles[0].rate, 1.0);  // the default
  // Whole waves of the large tile: the file's rate.
  EXPECT_DOUBLE_EQ(tile_efficiency(m, 256, 512), 1.0);
  EXPECT_DOUBLE_EQ(tile_efficiency(m, 512, 256), 1.0);  // transposed
  // Five large tiles: two waves, the second one-quarter full.
  EXPECT_DOUBLE_EQ(tile_efficiency(m, 640, 256), 5.0 / 8.0);
  for (const auto& [r, c] : {std::pair<int64_t, int64_t>{640, 256}, {130, 256}, {64, 64},
                             {2048, 2304}, {1, 50257}, {1000, 3000}, {96, 200}}) {
    EXPECT_NEAR(tile_efficiency(m, r, c), scheduled_efficiency(m, r, c), 1e-12) << r << "x" << c;
  }
  // A file without tiles: every shape at the file's rate.
  EXPECT_EQ(tile_efficiency(parse_machine(kHandWritten, "two.toml"), 130, 256), 1.0);
  // A GEMM's time: forward at its output's share; backward's two products,
  // dinp [m x k] and dW [k x n], each half its FLOPs at its own share.
  WorkItem w{Kernel::kMatmul, false, 640, 128, 256};
  w.flops = 2.0 * 640 * 128 * 256;
  EXPECT_DOUBLE_EQ(item_seconds(m, w), w.flops / (m.matmul_flops * tile_efficiency(m, 640, 256)));
  w.backward = true;
  w.flops *= 2;
  EXPECT_DOUBLE_EQ(item_seconds(m, w), w.flops / 2 / m.matmul_flops *
                                           (1 / tile_efficiency(m, 640, 128) +
                                            1 / tile_efficiency(m, 128, 256)));
}

TEST(MachineFile, ItsTomlReadsBackTheSame) {
  MachineSpec m = parse_machine(kHandWritten, "two.toml");
  m.matmul.push_back({256, 64, 192, 12.5e-6, 30e-6});
  m.attention.push_back({16, 32, 3e-6, 7e-6});
  m.kernels.push_back({4096, {{"layernorm", 9e9}, {"adamw", 5e9}}});
  m.inter = m.intra;
  m.inter.reduce_scatter.bandwidth = 25e9;
  m.inter.alltoall = {7e-6, 40e9};
  m.has_inter = true;
  m.stages.push_back({64, 32, 2, 3, Recompute::kFull, 1.25, 3e6});
  m.runtime = 12e6;
  m.precision = Precision::kFp16;
  m.multiprocessors = 132;
  m.matmul_tiles = {{128, 256, 1}, {64, 128, 0.625}};
  const MachineSpec r = parse_machine(m.to_toml(), "again.toml");
  EXPECT_EQ(r.multiprocessors, 132);
  EXPECT_EQ(r.matmul_tiles.at(1).cols, 128);
  EXPECT_DOUBLE_EQ(r.matmul_tiles.at(1).rate, 0.625);
  EXPECT_EQ(r.precision, Precision::kFp16);
  EXPECT_EQ(r.to_toml(), m.to_toml());
  EXPECT_DOUBLE_EQ(r.matmul.at(0).backward, 30e-6);
  EXPECT_DOUBLE_EQ(r.kernels.at(0).bandwidth.at("adamw"), 5e9);
  EXPECT_DOUBLE_EQ(r.inter.reduce_scatter.bandwidth, 25e9);
  EXPECT_DOUBLE_EQ(r.inter.alltoall.bandwidth, 40e9);
  EXPECT_DOUBLE_EQ(r.inter.alltoall.latency, 7e-6);
  EXPECT_DOUBLE_EQ(r.stages.at(0).factor, 1.25);
  EXPECT_EQ(r.stages.at(0).layers, 3);
  EXPECT_EQ(r.stages.at(0).recompute, Recompute::kFull);
}

std::string error_of(const std::string& text) {
  try {
    parse_machine(text, "bad.toml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(MachineFile, BadFilesAreNamedWithTheirKey) {
  std::string t = kHandWritten;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = t;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::pair<std::string, std::string> cases[] = {
      {with("memory_gib = 80", "memory_gb = 80"), "[machine] memory_gb"},
      {with("memory_gib = 80", "memory_gib = -1"), "[machine] memory_gib"},
      {with("device = \"cuda\"", "device = \"gpu\""), "[machine] device"},
      {with("bandwidth_gbs = 200", "bandwidth_gbs = \"fast\""), "[intra] bandwidth_gbs"},
      {with("[intra]", "[intro]"), "intro"},
      {with("gelu = 1000", "gelu = 0"), "[compute.kernel_gbs] gelu"},
      {with("devices_per_node = 2", "devices_per_node = 2.5"), "[machine] devices_per_node"},
      {with("matmul_tflops = 250", ""), "[compute] matmul_tflops"},
      {with("[compute]", "[compute]\nprecision = \"tf32\""), "[compute] precision"},
      {with("peak_tflops = 312", "peak_tflops = 312\nruntime_mb = 90000"),
       "[machine] runtime_mb: 90000 MB is as much as a device's whole memory"},
      {"[machine\n", "not valid TOML"},
      // Rates faster than the device's peak, or too small to be real.
      {with("peak_tflops = 312", "peak_tflops = 0.312"),
       "[compute] matmul_tflops: 250 TFLOP/s, above [machine] peak_tflops 0.312"},
      {with("matmul_tflops = 250", "matmul_tflops = 1e-300"), "[compute] matmul_tflops"},
      {with("bandwidth_gbs = 200", "bandwidth_gbs = 1e-300"), "[intra] bandwidth_gbs"},
      // GEMM tiles: whole sizes, a share of the large-GEMM rate, and the
      // multiprocessors they fill (each needs the other).
      {with("memory_gbs", "multiprocessors = 4\nmatmul_tiles = [{ rows = 128, cols = 128, rate = 1.5 }]\nmemory_gbs"),
       "[compute.matmul_tiles 1] rate"},
      {with("memory_gbs", "multiprocessors = 4\nmatmul_tiles = [{ rows = 64.5, cols = 128 }]\nmemory_gbs"),
       "[compute.matmul_tiles 1] rows: expected a whole number"},
      {with("memory_gbs", "multiprocessors = 4\nmatmul_tiles = [{ rows = 0, cols = 128 }]\nmemory_gbs"),
       "[compute.matmul_tiles 1] rows"},
      {with("memory_gbs", "multiprocessors = 4\nmemory_gbs"), "[compute] matmul_tiles: missing"},
      {with("memory_gbs", "matmul_tiles = [{ rows = 64, cols = 128 }]\nmemory_gbs"),
       "[compute] multiprocessors: missing"},
      {with("memory_gbs", "multiprocessors = 2.5\nmatmul_tiles = [{ rows = 64, cols = 128 }]\nmemory_gbs"),
       "[compute] multiprocessors: expected a whole number"},
  };
  for (const auto& [text, key] : cases) {
    const std::string e = error_of(text);
    EXPECT_NE(e.find("bad.toml"), std::string::npos) << e;
    EXPECT_NE(e.find(key), std::string::npos) << key << ": " << e;
  }
  std::string no_intra = t.substr(0, t.find("[intra]"));
  EXPECT_NE(error_of(no_intra).find("[intra]"), std::string::npos);
}

Deck tiny_deck() {
  Deck d;
  d.path = "tiny.toml";
  d.model = GptConfig{4, 4, 128, 64, 256};
  d.train.global_batch = 32;
  d.train.micro_batch = 16;
  return d;
}

MachineSpec workstation(double gib) {
  MachineSpec m = parse_machine(kHandWritten, "two.toml");
  m.device = Device::kCpu;
  m.memory = gib * 1024 * 1024 * 1024;
  m.runtime = 10e6;
  return m;
}

// --explain's bytes per parameter, GPT-2 124M's shape at dp 4: in bf16
// 2 (weights) + 4 (master) + 4 (gradients) + 8 (moments) replicated;
// zero 1 Megatron's 6 + 12/4 = 9 (the shard's rows are ends of rounding:
// within 0.2%); each further stage less; fp32 at zero 0 16 (its master is
// the weights). Per parameter of the stored table, alignment included.
TEST(Plan, ExplainGivesTheModelStateBytesPerParameterOfEachZeroStage) {
  Deck deck = tiny_deck();
  deck.model = gpt2_124m_shape();
  deck.parallel.dp = 4;
  deck.train.precision = Precision::kBf16;
  const std::vector<double> b = state_bytes_per_parameter(deck, Device::kCuda);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_DOUBLE_EQ(b[0], 18.0);
  EXPECT_NEAR(b[1], 9.0, 0.02);
  EXPECT_LT(b[2], b[1]);
  EXPECT_LT(b[3], b[2]);
  deck.train.precision = Precision::kFp32;
  EXPECT_DOUBLE_EQ(state_bytes_per_parameter(deck, Device::kCuda)[0], 16.0);
}

// [train] grad_compression: the data-parallel reduction priced at its
// wire width (bf16 half of float, int8 about a quarter) on the deck's
// layout, its buffers in the memory; and the search keeps to zero 0.
TEST(Plan, CompressedGradientsArePricedAndKeepToZeroZero) {
  Deck deck = tiny_deck();
  deck.parallel.dp = 4;
  const MachineSpec m = workstation(1);
  double sent[3] = {0, 0, 0}, memory[3] = {0, 0, 0};
  int i = 0;
  for (GradCompression c : {GradCompression::kNone, GradCompression::kBf16, GradCompression::kInt8}) {
    deck.train.grad_compression = c;
    const Prediction p = predict_step(deck, m);
    sent[i] = p.exposed_comm;
    memory[i] = p.memory_max;
    ++i;
    const Plan plan = plan_layouts(deck, m, 4, 4);
    for (const Prediction& q : plan.fitting)
      if (c != GradCompression::kNone) {
        EXPECT_EQ(q.layout.zero, 0) << q.layout.describe();
      }
  }
  EXPECT_LT(sent[1], sent[0]);
  EXPECT_LT(sent[2], sent[1]);
  // The residuals (4 bytes a parameter) and the wire buffers.
  EXPECT_GT(memory[1], memory[0]);
}

// The passes over each block's gradient window after its backward, every
// micro-batch, at the elementwise rate (set here to 1e9 bytes/s): 16-bit
// gradients at zero 1 add the float window into the 16-bit sums (8 bytes
// a parameter) where float gradients at zero 1 make no pass; at zero 2
// they round the window (6 bytes) and add 2 + 8 bytes over dp where float
// adds 4 + 8. Both over the blocks and the vocabulary's wte (whose
// gradients go through the windows from zero 2, and with 16-bit
// gradients at zero 1). The parameters are counted from the table's specs.
TEST(Plan, SixteenBitGradientsPayTheirWindowPasses) {
  Deck deck = tiny_deck();
  deck.parallel.dp = 4;
  deck.train.micro_batch = 4;  // 2 micro-batches
  deck.train.precision = Precision::kBf16;
  MachineSpec m = workstation(1);
  set_elementwise_rates(m, 1e9);
  double blocks = 0, vocab = 0;
  const StageRange range = stage_range_of(deck, 0, 0);
  const ParameterTable table(deck.model, range);
  const StageLayout layout(table, range);
  ASSERT_TRUE(layout.windows_vocab(true));
  for (const auto& spec : table.specs()) {
    if (spec.layer >= 0) blocks += static_cast<double>(spec.storage);
    if (layout.is_vocab(spec.offset)) vocab += static_cast<double>(spec.storage);
  }
  ASSERT_GT(vocab, 0);
  const double micro = static_cast<double>(deck.grad_accum()), dp = 4;
  ASSERT_EQ(micro, 2);
  auto compute = [&](int zero, GradDtype g) {
    deck.parallel.zero = zero;
    deck.train.grad_dtype = g;
    return predict_step(deck, m).compute;
  };
  const double zero1 = compute(1, GradDtype::kBf16) - compute(1, GradDtype::kFp32);
  EXPECT_NEAR(zero1, micro * (blocks + vocab) * 8 / 1e9, 1e-6 * zero1);
  const double zero2 = compute(2, GradDtype::kBf16) - compute(2, GradDtype::kFp32);
  EXPECT_NEAR(zero2, micro * (blocks + vocab) * (6 + (10 - 12) / dp) / 1e9, 1e-6 * zero2);
  EXPECT_GT(zero2, 0);
}

// Zero 3's vocabulary through the windows (zero_shards.hpp) is priced as
// the blocks' transfers are: the tiny deck's wte (256 x 128, smaller than
// a block) gathered before the embedding and before the head, every
// micro-batch; from zero 2 its gradients are reduce-scattered after each
// use, as zero 3's are. On the host nothing hides (host MPI progresses
// only while waited on), so zero 3's exposed communication exceeds zero
// 2's by, each micro-batch, the blocks' gathers and the vocabulary's
// gathers, less the blocks' and the vocabulary's bytes in the all-gather
// after AdamW (zero 3 gathers there only what it keeps whole). Each
// collective over dp 2 by the ring: 10 us + bytes / 2 / 200 GB/s (the
// hand-written machine's link). A vocabulary of 4096 rows
// is 2.6 blocks of 12 x 128^2 + 13 x 128 = 198,272 floats: it goes in
// pieces of 1544 rows (1549 fit a window, cut to a multiple of 8), 2 of
// them and one of 1008, a collective each. The gathers, as a run makes
// them (zero_shards.hpp's gathers listed by hand at n_embd 128 and 16):
//  - one piece: 1F1B keeps the block of the pass before beside the
//    embedding's window (block 0) and the head's (block L - 1), one a
//    pass, so 2 (L - 1) blocks; the head's piece is still there for its
//    backward: each use's piece once;
//  - 3 pieces fill both windows at each end: 2 L blocks; the head's
//    backward finds its last two pieces there and gathers its first again.
TEST(Plan, ZeroThreesVocabularyIsPricedAsTheBlocksTransfers) {
  for (const int64_t vocab_size : {int64_t{0}, int64_t{4096}}) {
    Deck deck = tiny_deck();
    if (vocab_size > 0) deck.model.vocab_size = vocab_size;
    deck.parallel.dp = 2;
    deck.train.micro_batch = 8;  // 2 micro-batches
    const MachineSpec m = workstation(1);
    const StageRange range = stage_range_of(deck, 0, 0);
    const ParameterTable table(deck.model, range);
    const StageLayout layout(table, range);
    ASSERT_TRUE(layout.windows_vocab(true));
    ASSERT_EQ(layout.block_storage(), 198272);
    const double block = static_cast<double>(layout.block_storage()) * 4;
    const double vocab = static_cast<double>(table.at("wpe").offset - table.at("wte").offset) * 4;
    ASSERT_GE(vocab, 256 * 128 * 4);
    std::vector<double> pieces{vocab};  // bytes
    if (vocab_size > 0) {
      pieces.assign(2, 1544.0 * 128 * 4);
      pieces.push_back(1008.0 * 128 * 4);
    }
    ASSERT_EQ(layout.vocab_pieces(StageLayout::kVocabIn), static_cast<int64_t>(pieces.size()));
    const auto ring = [](double bytes) { return 10e-6 + bytes / 2 / 200e9; };
    double each_way = 0;  // one use's gathers (or reduce-scatters), piece by piece
    for (const double p : pieces) each_way += ring(p);
    const double micro = static_cast<double>(deck.grad_accum()), L = 4;
    ASSERT_EQ(micro, 2);
    auto exposed = [&](int zero) {
      deck.parallel.zero = zero;
      return predict_step(deck, m).exposed_comm;
    };
    const bool one = pieces.size() == 1;
    const double blocks = one ? 2 * (L - 1) : 2 * L, again = one ? 0 : ring(pieces[0]);
    const double want = micro * (blocks * ring(block) + 2 * each_way + again) -
                        (L * block + vocab) / 2 / 200e9;
    EXPECT_NEAR(exposed(3) - exposed(2), want, 1e-9 * want) << "vocabulary " << vocab_size;
  }
}

// On a GPU the data-parallel transfers run on a stream of their own
// beside the passes (ActionCosts::block_transfers), played out here by a
// reference of the one stage's 1F1B, pass by pass:
//  - zero 2-3: each block's reduce-scatter after its backward runs on
//    beside the passes that follow until its window is needed again: with
//    two blocks, a transfer longer than a block's backward but shorter
//    than its forward and backward together hides behind the next
//    micro-batch's forward, where pricing each block's excess over its
//    backward (the planner before) exposed all of it. At zero 3 the two
//    blocks' gathers come first, on the same stream, after the gathers
//    after AdamW of the tensors kept whole; both stay in their windows
//    from then on under 1F1B.
//  - zero 1: the gathers after AdamW (the embedding's, a block's each, the
//    final norm's) from the step's start, each forward waiting for what it
//    is about to use. Before, the planner exposed the whole gather.
//  - zero 0-1: each block's gradients, summed over the micro-batches,
//    reduced once after its last micro-batch's backward, the final norm's
//    after the head's backward and the embedding's after its own; the
//    step waits for them. Before, they hid behind one micro-batch's
//    backward but their excess.
// The passes' seconds are read off a run whose links cost nothing; the
// parts of them before and after the blocks (the embedding's, the
// head's) are the kernels' prices of those alone, scaled as that run's
// forward is; the transfers are the ring's count. The vocabulary (128 x
// 64, a sixth of a window: one piece) goes through the windows, its
// gathers (zero 3) and reduce-scatters (zero 2-3) hidden behind the backward's
// share (tested apart: ZeroThreesVocabularyIsPricedAsTheBlocksTransfers;
// the exact match below would show it if they were not), but for the
// last micro-batch's reduce-scatters, on the stream with the head's and
// the embedding's reductions, where the step waits for them. Tolerance 1e-9
// (sums of a few dozen doubles).
TEST(Plan, ZeroTwoAndThreesTransfersOnADeviceHideBehindThePassesThatFollow) {
  Deck deck = tiny_deck();
  deck.parallel.dp = 2;
  deck.model.n_layer = 2;      // two blocks, two windows: no pass waits
  deck.train.micro_batch = 2;  // 8 micro-batches
  const int64_t M = deck.grad_accum(), L = deck.model.n_layer;
  ASSERT_EQ(M, 8);
  const StageRange range = stage_range_of(deck, 0, 0);
  const ParameterTable table(deck.model, range);
  const StageLayout layout(table, range);
  ASSERT_TRUE(layout.windows_vocab(true));
  ASSERT_EQ(layout.vocab_pieces(StageLayout::kVocabIn), 1);
  ASSERT_LE(6 * layout.vocab_in.size(), layout.block_storage());
  const double block = static_cast<double>(layout.block_storage()) * 4;
  MachineSpec fast = parse_machine(kHandWritten, "two.toml");
  ASSERT_EQ(fast.device, Device::kCuda);
  fast.intra.reduce_scatter = fast.intra.allgather = fast.intra.allreduce = {0, 1e30};
  // A tensor's float bytes over a link of the ring of two: `share` of
  // them a round (a reduce-scatter's or gather's half; an all-reduce's
  // two halves).
  const auto seconds = [&](std::initializer_list<const char*> names, double bytes_each,
                           double share, const LinkCost& link) {
    double sum = 0;
    for (const char* name : names)
      sum += static_cast<double>(table.at(name).storage) * bytes_each * share / link.bandwidth;
    return sum;
  };
  // The passes: forward f, backward b, and their parts before and after
  // the blocks (lf, tf: the embedding's, the head's forward; lb, tb: the
  // head's, the embedding's backward).
  struct Passes {
    double f = 0, b = 0, lf = 0, tf = 0, lb = 0, tb = 0;
  };
  const auto passes = [&]() {
    Passes p;
    const Prediction ideal = predict_step(deck, fast);
    for (const TimedAction& t : ideal.step.timeline[0]) {
      if (t.action.op == Op::Forward) p.f = t.end - t.start;
      if (t.action.op == Op::Backward) p.b = t.end - t.start;
    }
    const double act = deck.train.precision == Precision::kFp32 ? 4 : 2;
    const auto priced = [&](bool embedding, bool head, int64_t layers) {
      StageRange r = range;
      r.last_layer = layers;
      r.has_embedding = embedding;
      r.has_head = head;
      return kernel_seconds(fast, deck.model, r, deck.train.micro_batch, deck.train.recompute, act);
    };
    const auto whole = priced(true, true, L);
    const double scale = p.f / whole.first;
    p.lf = scale * priced(true, false, 0).first;
    p.tf = scale * priced(false, true, 0).first;
    p.lb = scale * priced(false, true, 0).second;
    p.tb = scale * (whole.second - priced(false, true, L).second);
    EXPECT_GT(p.lf, 0);
    EXPECT_GT(p.tf, 0);
    EXPECT_GT(p.lb, 0);
    EXPECT_GT(p.tb, 0);
    EXPECT_LT(p.lf + p.tf, p.f);
    EXPECT_LT(p.lb + p.tb, p.b);
    return p;
  };
  // The stream's transfers: zero 3's block gathers (g); the gathers after
  // AdamW, the embedding's, a block's, the head's (pe, pb, ph); a block's
  // reduce-scatter every micro-batch (r) or its reduction once (rl); the
  // head's and the embedding's reductions (rh, re).
  struct Stream {
    double g = 0, pe = 0, pb = 0, ph = 0, r = 0, rl = 0, rh = 0, re = 0;
  };
  struct Played {
    double end = 0, waited = 0, window_waits = 0;
  };
  const auto play = [&](const Passes& p, const Stream& x) {
    Played out;
    double t = 0, idle = x.pe + static_cast<double>(L) * x.pb + x.ph;
    double window[2] = {0, 0}, gathered[2] = {0, 0};
    int64_t holds[2] = {-1, -1};  // the block each weight window holds
    int turn = 0;
    const auto wait = [&](double until) {
      if (until > t) {
        out.waited += until - t;
        t = until;
      }
    };
    const auto issue = [&](double transfer) {
      if (transfer > 0) idle = std::max(idle, t) + transfer;
    };
    const double fb = (p.f - p.lf - p.tf) / static_cast<double>(L);
    const double bb = (p.b - p.lb - p.tb) / static_cast<double>(L);
    // Zero 3's block gathers (x.g): a block's window not holding it is
    // filled, the next block's started before this one computes. The
    // vocabulary's one piece beside each end takes the window its
    // neighbouring block does not: the embedding's window 1 before the
    // forward, the head's window L % 2 after it (its own transfers hide
    // behind the passes here). So each pass keeps one block of the last.
    const auto gather = [&](int64_t i) {
      if (x.g == 0 || holds[i % 2] == i) return;
      issue(x.g);
      holds[i % 2] = i;
      gathered[i % 2] = idle;
    };
    const auto use = [&](int64_t i, int64_t next) {
      gather(i);
      if (x.g > 0) wait(gathered[i % 2]);
      if (next >= 0) gather(next);
    };
    for (int64_t k = 0; k < M; ++k) {
      wait(x.pe);
      t += p.lf;
      holds[1] = -1;
      for (int64_t i = 0; i < L; ++i) {
        wait(x.pe + x.pb * static_cast<double>(i + 1));
        use(i, i + 1 < L ? i + 1 : -1);
        t += fb;
      }
      holds[L % 2] = -1;
      wait(x.pe + static_cast<double>(L) * x.pb + x.ph);
      t += p.tf;
      const bool last = k == M - 1;
      t += p.lb;
      if (last) issue(x.rh);
      for (int64_t i = L - 1; i >= 0; --i) {
        use(i, i > 0 ? i - 1 : -1);
        if (x.r > 0) {
          out.window_waits += std::max(0.0, window[turn] - t);
          wait(window[turn]);
        }
        t += bb;
        if (x.r > 0) {
          issue(x.r);
          window[turn] = idle;
          turn ^= 1;
        } else if (last) {
          issue(x.rl);
        }
      }
      t += p.tb;
      if (last) issue(x.re);
    }
    wait(idle);  // the step's reduction waits for the stream
    out.end = t;
    return out;
  };
  const auto step_parts = [](const Prediction& q) {
    double reduce = 0, optimizer = 0;
    for (const TimedAction& t : q.step.timeline[0]) {
      if (t.action.op == Op::ReduceGradients) reduce = t.end - t.start;
      if (t.action.op == Op::OptimizerStep) optimizer = t.end - t.start;
    }
    return std::pair{reduce, optimizer};
  };

  for (int64_t zero : {2, 3}) {
    deck.parallel.zero = zero;
    const Passes p = passes();
    const double per = 1.0 / static_cast<double>(L);
    // A block's reduce-scatter between its backward and its forward +
    // backward; a gather of three quarters of a block's forward.
    const double r = (0.8 * p.f + p.b) * per, g = zero == 3 ? 0.75 * p.f * per : 0;
    ASSERT_GT(r, p.b * per);
    ASSERT_LT(r, (p.f + p.b) * per);
    MachineSpec slow = fast;
    slow.intra.reduce_scatter = {0, block / 2 / r};  // the ring of two: half the bytes
    if (zero == 3) slow.intra.allgather = {0, block / 2 / g};  // fp32 weights: the same bytes
    Stream x;
    x.g = g;
    x.r = r;
    // At zero 3 the step's stream starts with the gathers after AdamW of
    // what it keeps whole (the positions, the final norm; the vocabulary
    // goes through the windows).
    if (zero == 3) {
      x.pe = seconds({"wpe"}, 4, 0.5, slow.intra.allgather);
      x.ph = seconds({"ln_f.weight", "ln_f.bias"}, 4, 0.5, slow.intra.allgather);
    }
    // The last micro-batch's reductions after the head's backward and the
    // embedding's: the vocabulary's reduce-scatter of each use (the tied
    // wte, one piece; its gradients go through the windows from zero 2)
    // with them, on the same stream.
    x.rh = seconds({"ln_f.weight", "ln_f.bias", "wte"}, 4, 0.5, slow.intra.reduce_scatter);
    x.re = seconds({"wte", "wpe"}, 4, 0.5, slow.intra.reduce_scatter);
    const Played want = play(p, x);
    const Prediction q = predict_step(deck, slow);
    const auto [reduce, optimizer] = step_parts(q);
    EXPECT_NEAR(q.step.step_time, want.end + reduce + optimizer, 1e-9 * want.end)
        << "zero " << zero;
    EXPECT_NEAR(q.step.reduction_waits[0], want.waited, 1e-9 * want.end) << "zero " << zero;
    EXPECT_EQ(want.window_waits, 0) << "zero " << zero;
    // The waits are the step's exposed communication, not a bubble (one stage).
    EXPECT_NEAR(q.bubble, 0, 1e-9 * want.end) << "zero " << zero;
    // At zero 2 only the last micro-batch's transfers wait (the step's
    // reduction for them): each block's excess over its backward, every
    // micro-batch, is what the planner priced before (and the tensors
    // outside the blocks, whole, as it still nearly does). (At zero 3 the
    // two blocks the vocabulary's pieces took from the windows are
    // gathered again every micro-batch, queued behind the reduce-scatters
    // on the one stream: the exact match above is its check.)
    if (zero == 2) {
      const double others = x.rh + x.re + x.pe + x.ph;
      EXPECT_LT(want.waited, 2 * r + others);
      EXPECT_GT(static_cast<double>(M * L) * (r - p.b * per), 2 * (want.waited - others));
    }
  }

  // Zero 1's gathers after AdamW (its reduce-scatters free), a block's
  // three quarters of a block's forward: the first forward waits for the
  // embedding's, for block 0's (block 1's arrives while block 0
  // computes) and for the final norm's before the head.
  deck.parallel.zero = 1;
  {
    const Passes p = passes();
    const double g = 0.75 * p.f / static_cast<double>(L);
    MachineSpec slow = fast;
    slow.intra.allgather = {0, block / 2 / g};
    Stream x;
    x.pe = seconds({"wte", "wpe"}, 4, 0.5, slow.intra.allgather);
    x.pb = g;
    x.ph = seconds({"ln_f.weight", "ln_f.bias"}, 4, 0.5, slow.intra.allgather);
    const Played want = play(p, x);
    const Prediction q = predict_step(deck, slow);
    EXPECT_NEAR(q.step.reduction_waits[0], want.waited, 1e-9 * q.step.step_time);
    EXPECT_LT(q.step.reduction_waits[0], static_cast<double>(L) * g + x.pe + x.ph - 0.5 * g);
    // Not also in the optimizer's step, whatever the link (its length
    // read off the timeline: rounded where it starts).
    EXPECT_NEAR(step_parts(q).second, step_parts(predict_step(deck, fast)).second,
                1e-12 * q.step.step_time);
  }

  // Zero 0-1's reductions (the gathers free again): a block's float
  // gradients take a quarter more than its backward. Zero 1
  // reduce-scatters (with 16-bit gradients the blocks' and the
  // vocabulary's in 2 bytes, the rest in 4), zero 0 all-reduces (twice a
  // reduce-scatter's bytes).
  for (const auto& [z, grad16] : {std::pair{1, false}, {1, true}, {0, false}}) {
    deck.parallel.zero = z;
    deck.train.precision = grad16 ? Precision::kBf16 : Precision::kFp32;
    deck.train.grad_dtype = grad16 ? GradDtype::kBf16 : GradDtype::kFp32;
    const Passes p = passes();
    const double r = 1.25 * p.b / static_cast<double>(L);
    MachineSpec slow = fast;
    const double share = z == 0 ? 1.0 : 0.5;
    LinkCost& link = z == 0 ? slow.intra.allreduce : slow.intra.reduce_scatter;
    link = {0, block * share / r};  // a block's float bytes in r
    Stream x;
    x.rl = grad16 ? r / 2 : r;
    x.rh = seconds({"ln_f.weight", "ln_f.bias"}, 4, share, link);
    // (16-bit gradients at zero 1 sum the vocabulary's in 16 bits too.)
    x.re = seconds({"wpe"}, 4, share, link) + seconds({"wte"}, grad16 ? 2 : 4, share, link);
    const Played want = play(p, x);
    const Prediction q = predict_step(deck, slow);
    EXPECT_NEAR(q.step.reduction_waits[0], want.waited, 1e-9 * want.end) << z << grad16;
    EXPECT_NEAR(q.step.step_time, want.end + step_parts(q).second, 1e-9 * want.end) << z << grad16;
    if (!grad16) {
      EXPECT_GT(want.waited, static_cast<double>(L) * r - p.b);
    }
  }
}

TEST(Plan, ListsValidLayoutsWithTheRunsOwnMemoryFastestFirst) {
  const Deck deck = tiny_deck();
  const MachineSpec m = workstation(1);
  const Plan plan = plan_layouts(deck, m, 4, 4);
  // tp in {1, 2, 4} x pp in {1, 2, 4} with pp x tp | 4: (1,1) (1,2) (1,4)
  // (2,1) (2,2) (4,1); dp = 4 / (tp x pp) divides 32.
  ASSERT_FALSE(plan.fitting.empty());
  EXPECT_EQ(static_cast<size_t>(plan.considered), plan.fitting.size());  // 1 GiB: all fit
  for (size_t i = 0; i < plan.fitting.size(); ++i) {
    const Prediction& p = plan.fitting[i];
    const Layout& l = p.layout;
    EXPECT_EQ(l.dp * l.pp * l.tp * l.cp, 4);
    EXPECT_EQ(deck.model.n_head % l.tp, 0);
    EXPECT_EQ(deck.model.seq_len % (2 * l.cp), 0);
    EXPECT_EQ(deck.train.global_batch % (l.dp * l.micro_batch), 0) << l.describe();
    if (l.dp * l.cp == 1) {
      EXPECT_EQ(l.zero, 0);
    }
    if (i > 0) {
      EXPECT_GE(plan.fitting[i - 1].tokens_per_s, p.tokens_per_s);
    }
    const std::vector<RankMemory> want = predicted_memory(with_layout(deck, l), BackendChoice{});
    ASSERT_EQ(p.memory.size(), want.size());
    double worst = 0;
    for (size_t s = 0; s < want.size(); ++s) {
      EXPECT_EQ(p.memory[s].total(), want[s].total()) << l.describe();
      worst = std::max(worst, want[s].total());
    }
    EXPECT_EQ(p.memory_max, worst + m.runtime);
    EXPECT_LE(p.memory_max, 0.9 * p.memory_available);  // the default margin
    EXPECT_DOUBLE_EQ(p.memory_planned, 0.9 * p.memory_available);
    if (l.pp == 1) {
      EXPECT_NEAR(p.bubble, 0, 1e-9 * p.step.step_time) << l.describe();
    }
    EXPECT_GT(p.step.step_time, p.compute);
  }
  // Each (tp, pp) pair appears.
  for (auto [tp, pp] : {std::pair{1, 1}, {2, 1}, {4, 1}, {1, 2}, {2, 2}, {1, 4}}) {
    bool seen = false;
    for (const Prediction& p : plan.fitting) {
      seen |= p.layout.tp == tp && p.layout.pp == pp;
    }
    EXPECT_TRUE(seen) << "tp " << tp << " pp " << pp;
  }
}

// The planner prices sequence parallelism as what it is: less memory per
// rank (the rows kept), more time in the tensor group (backward's extra
// gathers), and searches it where tp > 1 divides seq_len; when only
// sequence-parallel layouts fit, that is what it recommends.
// Split backward (zb-h1): B holds each block GEMM's input-gradient half
// (and the head's whole backward), W the weight-gradient half (and the
// embedding's backward), so the FLOPs only move; W gathers again, under sequence parallelism, the rows its GEMMs
// read (two more all-gathers a block: the gradients B gathered too) and
// sums the LayerNorms' weight gradients.
TEST(StageWork, SplitBackwardMovesTheWeightGradientsToW) {
  const GptConfig cfg{4, 4, 64, 32, 300};
  using TC = TensorCollective;
  auto count = [](const std::vector<TensorCollective>& list, TensorCollective::Kind k) {
    size_t n = 0;
    for (const auto& c : list) n += c.kind == k;
    return n;
  };
  for (int stage = 0; stage < 2; ++stage) {
    for (const bool sp : {false, true}) {
      const StageRange range = partition_stage(cfg, stage, 2, 2, 0);
      const StageWork whole = stage_work(cfg, range, 2, Recompute::kAttention, 4, sp);
      const StageWork split = stage_work(cfg, range, 2, Recompute::kAttention, 4, sp, true);
      const size_t blocks = static_cast<size_t>(range.num_layers());
      EXPECT_TRUE(whole.weights.empty() && whole.tp_weights.empty());
      EXPECT_EQ(flops(split.forward), flops(whole.forward));
      EXPECT_EQ(flops(split.backward) + flops(split.weights), flops(whole.backward));
      // Each block's four GEMMs: half their backward FLOPs.
      double gemm = 0;
      for (const WorkItem& w : whole.backward)
        if (w.kernel == Kernel::kMatmul && w.n != cfg.padded_vocab(2) / 2) gemm += w.flops;
      EXPECT_EQ(flops(split.weights), gemm / 2);
      EXPECT_EQ(split.weights.size(), 4 * blocks + (stage == 0 ? 1 : 0));
      // The input gradients' sums stay B's: the previous stage waits for them.
      EXPECT_EQ(count(split.tp_backward, TC::kReduceScatter) + count(split.tp_backward, TC::kAllreduce),
                2 * blocks + (stage == 1 ? (sp ? 2 : 1) : 0));
      const size_t gathers_whole = count(whole.tp_backward, TC::kAllgather);
      const size_t gathers_split =
          count(split.tp_backward, TC::kAllgather) + count(split.tp_weights, TC::kAllgather);
      EXPECT_EQ(gathers_split, gathers_whole + (sp ? 2 * blocks : 0));
      EXPECT_EQ(count(split.tp_weights, TC::kAllreduce), sp ? blocks : 0);
    }
  }
}

TEST(Plan, ZeroBubbleIsPricedAndSearched) {
  // pp 4 on four ranks, 8 micro-batches: zb-h1 shortens 1F1B's step by
  // the W's it moves into the drain, at the memory of 1F1B's fullest stage.
  Deck deck = tiny_deck();
  deck.parallel.pp = 4;
  deck.train.micro_batch = 4;
  const MachineSpec m = workstation(1);
  const Prediction ob = predict_step(deck, m, 4);
  deck.parallel.schedule = ScheduleKind::kZbH1;
  const Prediction zb = predict_step(deck, m, 4);
  EXPECT_LT(zb.step.step_time, ob.step.step_time);
  EXPECT_LT(zb.bubble, ob.bubble);
  // The same work, split, and the copies B keeps for W.
  EXPECT_GE(zb.compute, ob.compute);
  EXPECT_LT(zb.compute, 1.1 * ob.compute);
  // Activations no more than 1F1B's fullest stage's (stage 0); in all, a
  // little more: later stages keep a send buffer per slot for their input
  // gradients (pp of them, where 1F1B's stage 0 needs none).
  for (const RankMemory& r : zb.memory)
    EXPECT_LE(r.stage.activations, ob.memory[0].stage.activations * 1.01);
  EXPECT_LE(zb.memory_max, ob.memory_max * 1.03);
  // Every stage holds pp micro-batches: later stages fuller than under 1F1B.
  EXPECT_EQ(zb.memory.back().slots, 4);
  EXPECT_EQ(ob.memory.back().slots, 1);
  EXPECT_EQ(zb.layout.describe(), "dp 1 pp 4 tp 1 mb 4 zero 0 none zb-h1");

  const Plan all = plan_layouts(tiny_deck(), m, 4, 4);
  bool searched = false;
  for (const Prediction& p : all.fitting) {
    searched |= p.layout.schedule == ScheduleKind::kZbH1;
    EXPECT_FALSE(p.layout.schedule == ScheduleKind::kZbH1 && p.layout.recompute == Recompute::kFull)
        << p.layout.describe();
  }
  EXPECT_TRUE(searched);
}

// The tiny deck at `layers` layers, pp 2, 8 micro-batches of 4, wider so
// that computing outweighs the messages (interleaving sends v times as
// many): priced under 1F1B, then interleaved with two chunks a stage.
std::pair<Prediction, Prediction> one_f_one_b_then_interleaved(int64_t layers) {
  Deck deck = tiny_deck();
  deck.model.n_layer = layers;
  deck.model.n_embd = 512;
  deck.model.seq_len = 256;
  deck.parallel.pp = 2;
  deck.train.micro_batch = 4;
  const MachineSpec m = workstation(8);
  Prediction ob = predict_step(deck, m, 2);
  deck.parallel.schedule = ScheduleKind::kInterleaved;
  deck.parallel.virtual_stages = 2;
  return {std::move(ob), predict_step(deck, m, 2)};
}

TEST(Plan, InterleavingIsPricedAndSearched) {
  // pp 2, 8 micro-batches, two chunks of one layer per stage: the fill and
  // drain are chunk passes, half a stage's, so the bubble about halves
  // (exactly without messages and with equal chunks; here the embedding
  // and the head make the chunks unequal); stage 0 holds
  // 2 (pp - 1) + (v - 1) pp + 1 = 5 chunks of one layer where 1F1B holds
  // 2 micro-batches of two.
  const auto [ob, il] = one_f_one_b_then_interleaved(4);
  EXPECT_LT(il.step.step_time, ob.step.step_time);
  EXPECT_LT(il.bubble, 0.75 * ob.bubble);
  EXPECT_NEAR(il.compute, ob.compute, 0.02 * ob.compute);  // the same work, in chunks
  EXPECT_EQ(il.memory[0].slots, 5);
  EXPECT_EQ(ob.memory[0].slots, 2);
  EXPECT_GT(il.memory[0].stage.activations, ob.memory[0].stage.activations);
  EXPECT_LT(il.memory[0].stage.per_slot, 0.6 * ob.memory[0].stage.per_slot);
  EXPECT_EQ(il.layout.describe(), "dp 1 pp 2 tp 1 mb 4 zero 0 none interleaved v2");
  // Each chunk's pass in the simulated timeline: 8 micro-batches x 2 chunks.
  int forwards = 0;
  for (const TimedAction& t : il.step.timeline[0]) forwards += t.action.op == Op::Forward;
  EXPECT_EQ(forwards, 16);

  const Plan all = plan_layouts(tiny_deck(), workstation(1), 2, 2);
  bool searched = false;
  for (const Prediction& p : all.fitting) {
    if (p.layout.schedule != ScheduleKind::kInterleaved) continue;
    searched = true;
    const Deck d = with_layout(tiny_deck(), p.layout);
    EXPECT_TRUE(layer_chunks(d.model.n_layer, p.layout.pp, p.layout.virtual_stages).refusal.empty())
        << p.layout.describe();
    EXPECT_EQ(d.grad_accum() % p.layout.pp, 0) << p.layout.describe();
  }
  EXPECT_TRUE(searched);
}

// Chunks of unequal length (core/layer_chunks.hpp): 6 layers on pp 2 x v 2
// hold 3 layers a stage (chunks of 1 and 2, then 2 and 1), as 1F1B's
// stages do, so the busiest stage computes what 1F1B's does (to 2%, the
// embedding and head's share of the chunks' sums); a slot holds the
// longest chunk's 2 layers, and the search, which refused 6 layers on 4
// chunks before, offers the layout.
TEST(Plan, UnevenChunksArePricedByTheLayersEachHolds) {
  const auto [ob, il] = one_f_one_b_then_interleaved(6);
  EXPECT_NEAR(il.compute, ob.compute, 0.02 * ob.compute);
  EXPECT_LT(il.bubble, 0.75 * ob.bubble);
  // 2 (pp - 1) + (v - 1) pp + 1 = 5 slots of 2 layers, 1F1B's 2 of 3.
  EXPECT_EQ(il.memory[0].slots, 5);
  EXPECT_NEAR(il.memory[0].stage.activations, 5.0 / 2 * 2 / 3 * ob.memory[0].stage.activations,
              0.05 * ob.memory[0].stage.activations);

  Deck six = tiny_deck();
  six.model.n_layer = 6;
  const Plan all = plan_layouts(six, workstation(1), 2, 2);
  bool searched = false;
  for (const Prediction& p : all.fitting)
    searched |= p.layout.pp == 2 && p.layout.virtual_stages == 2;
  EXPECT_TRUE(searched);
}

TEST(Plan, SequenceParallelismIsPricedAndSearched) {
  Deck deck = tiny_deck();
  deck.parallel.tp = 2;
  const MachineSpec m = workstation(1);
  const Prediction plain = predict_step(deck, m, 2);
  deck.parallel.sequence_parallel = true;
  const Prediction sp = predict_step(deck, m, 2);
  EXPECT_LT(sp.memory_max, plain.memory_max);
  EXPECT_GT(sp.tp_comm, plain.tp_comm);
  EXPECT_EQ(sp.layout.describe(), plain.layout.describe() + " sp");

  deck = tiny_deck();
  const Plan all = plan_layouts(deck, m, 2, 2);
  double leanest_plain = 1e300;
  bool searched = false;
  for (const Prediction& p : all.fitting) {
    searched |= p.layout.sequence_parallel;
    EXPECT_TRUE(!p.layout.sequence_parallel || p.layout.tp > 1) << p.layout.describe();
    if (!p.layout.sequence_parallel) leanest_plain = std::min(leanest_plain, p.memory_max);
  }
  EXPECT_TRUE(searched);
  ASSERT_LT(all.leanest.memory_max, leanest_plain);
  EXPECT_TRUE(all.leanest.layout.sequence_parallel) << all.leanest.layout.describe();
  // A device between the two: only sequence-parallel layouts fit.
  const double gib = 1024.0 * 1024 * 1024;
  const MachineSpec tight =
      workstation((all.leanest.memory_max + leanest_plain) / 2 / 0.9 / gib);
  const Plan plan = plan_layouts(deck, tight, 2, 2);
  ASSERT_FALSE(plan.fitting.empty());
  for (const Prediction& p : plan.fitting) EXPECT_TRUE(p.layout.sequence_parallel);
}

// Context parallelism, by hand: a rank's GEMMs and elementwise work are a
// cp-th of one rank's (B T / cp rows); its attention the ring's blocks,
// rank r's two chunks seeing (r + 1) + (2 cp - r) = 2 cp + 1 chunks of n =
// T / (2 cp) keys, each block 4 B heads n^2 hs FLOPs forward; each layer's
// ring pass sends cp - 1 key/value blocks of B T / cp rows x 2 K floats
// forward, 2 (cp - 1) + 1 backward (their gradients' sums, and home).
TEST(StageWork, ContextParallelismDividesTheRowsAndRingsTheAttention) {
  GptConfig cfg;
  cfg.family = ModelFamily::kLlama;
  cfg.n_layer = 3;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.n_embd = 64;
  cfg.ffn_hidden = 96;
  cfg.seq_len = 48;
  cfg.vocab_size = 300;
  const StageRange all = partition_stage(cfg, 0, 1);
  const double B = 2, T = 48, hs = 16, H = 4, K = 2 * hs, L = 3;
  auto attention_flops = [](const std::vector<WorkItem>& items) {
    double f = 0;
    for (const WorkItem& w : items)
      if (w.kernel == Kernel::kAttention) f += w.flops;
    return f;
  };
  const StageWork one = stage_work(cfg, all, 2, Recompute::kNone, 4);
  const double gemms = flops(one.forward) - attention_flops(one.forward);
  for (int64_t cp : {2, 3, 4}) {
    const StageWork w = stage_work(cfg, all, 2, Recompute::kNone, 4, false, false, 1.0, cp);
    const double n = T / (2.0 * static_cast<double>(cp)), c = static_cast<double>(cp);
    EXPECT_DOUBLE_EQ(flops(w.forward) - attention_flops(w.forward), gemms / c) << "cp " << cp;
    EXPECT_DOUBLE_EQ(attention_flops(w.forward), L * 4 * B * H * (2 * c + 1) * n * n * hs) << "cp " << cp;
    EXPECT_DOUBLE_EQ(attention_flops(w.backward), 2 * attention_flops(w.forward)) << "cp " << cp;
    // Per layer, the two diagonal blocks causal, the 2 cp - 1 others whole.
    double unmasked = 0, blocks = 0;
    for (const WorkItem& x : w.forward) {
      if (x.kernel != Kernel::kAttention) continue;
      EXPECT_EQ(x.n, n) << "cp " << cp;
      blocks += static_cast<double>(x.m) / (B * H);
      if (x.unmasked) unmasked += static_cast<double>(x.m) / (B * H);
    }
    EXPECT_EQ(blocks, L * (2 * c + 1));
    EXPECT_EQ(unmasked, L * (2 * c - 1));
    EXPECT_DOUBLE_EQ(w.message_bytes, one.message_bytes / c);
    const double block = B * T / c * 2 * K * 4;
    EXPECT_DOUBLE_EQ(w.cp_block_bytes, block);
    EXPECT_DOUBLE_EQ(w.cp_sums_bytes, block);  // fp32: the sums are the blocks' size
    ASSERT_EQ(w.cp_forward.size(), 3u);
    ASSERT_EQ(w.cp_backward.size(), 3u);
    // Forward c - 1 blocks; backward those again and c sums (one home).
    for (const auto& p : w.cp_forward) {
      EXPECT_EQ(p.blocks, c - 1);
      EXPECT_EQ(p.sums, 0);
      EXPECT_DOUBLE_EQ(w.ring_bytes(p), (c - 1) * block);
    }
    for (const auto& p : w.cp_backward) {
      EXPECT_EQ(p.blocks, c - 1);
      EXPECT_EQ(p.sums, c);
      EXPECT_DOUBLE_EQ(w.ring_bytes(p), (2 * c - 1) * block);
    }
    // In 16 bits the blocks are half the bytes; their sums stay float: one
    // message each, of twice a block's bytes.
    const StageWork half = stage_work(cfg, all, 2, Recompute::kNone, 2, false, false, 1.0, cp);
    EXPECT_DOUBLE_EQ(half.cp_block_bytes, block / 2);
    EXPECT_DOUBLE_EQ(half.cp_sums_bytes, block);
    EXPECT_EQ(half.cp_backward.front().sums, c);
    // Recomputed attention runs its ring forward again in backward.
    const StageWork rc = stage_work(cfg, all, 2, Recompute::kAttention, 4, false, false, 1.0, cp);
    EXPECT_EQ(rc.cp_backward.size(), 6u);
  }
  EXPECT_TRUE(one.cp_forward.empty() && one.cp_backward.empty());
}

// The planner prices cp as what it is: a cp-th of the activations per rank
// (the same accounting the run refuses a deck with), the ring's sends on
// the context group's link, the reductions over dp x cp; the search tries
// cp where 2 cp divides the sequence, on the host and on a GPU, dense or
// a Mixture of Experts.
TEST(Plan, ContextParallelismIsPricedAndSearched) {
  Deck deck = tiny_deck();
  const MachineSpec m = workstation(1);
  deck.parallel.dp = 2;
  const Prediction dp2 = predict_step(deck, m, 2);
  deck.parallel.dp = 1;
  deck.parallel.cp = 2;
  const Prediction cp2 = predict_step(deck, m, 2);
  EXPECT_EQ(cp2.layout.describe(), "dp 1 pp 1 tp 1 mb 16 zero 0 none 1f1b cp 2");
  EXPECT_GT(cp2.cp_comm, 0);
  EXPECT_EQ(dp2.cp_comm, 0);
  const RankMemory& a = dp2.memory[0];
  const RankMemory& b = cp2.memory[0];
  // dp 2 runs one micro-batch of 16 sequences; cp 2 two of 16 half-sequences.
  EXPECT_NEAR(b.stage.per_slot, a.stage.per_slot / 2, 0.1 * a.stage.per_slot);
  EXPECT_EQ(b.comm - a.comm,
            context_attention_bytes(deck.model, 1, 16, 2, 4, 4));  // the same reduction otherwise
  deck.parallel.zero = 1;
  // Sharded over the 2 replicas (the shards' ends at rows: within 0.1%).
  EXPECT_NEAR(predict_step(deck, m, 2).memory[0].optimizer, a.optimizer / 2, 1e-3 * a.optimizer);

  deck = tiny_deck();
  const Plan plan = plan_layouts(deck, m, 4, 4);
  std::set<int64_t> cps;
  for (const Prediction& p : plan.fitting) cps.insert(p.layout.cp);
  EXPECT_EQ(cps, (std::set<int64_t>{1, 2, 4}));
  deck.model.seq_len = 60;  // 2 cp divides it for cp 1, 2 (60 = 4 x 15), not 4
  cps.clear();
  for (const Prediction& p : plan_layouts(deck, m, 4, 4).fitting) cps.insert(p.layout.cp);
  EXPECT_EQ(cps, (std::set<int64_t>{1, 2}));
  MachineSpec gpu = m;
  gpu.device = Device::kCuda;
  deck = tiny_deck();
  cps.clear();
  for (const Prediction& p : plan_layouts(deck, gpu, 4, 4).fitting) cps.insert(p.layout.cp);
  EXPECT_EQ(cps, (std::set<int64_t>{1, 2, 4}));
  // The GPU's ring keeps no score tiles: its buffers are the host's less them.
  EXPECT_LT(context_attention_bytes(deck.model, 1, 16, 2, 4, 4, Device::kCuda),
            context_attention_bytes(deck.model, 1, 16, 2, 4, 4));
  deck.model.experts = 4;
  deck.model.top_k = 2;
  cps.clear();
  for (const Prediction& p : plan_layouts(deck, gpu, 4, 4).fitting) cps.insert(p.layout.cp);
  EXPECT_EQ(cps, (std::set<int64_t>{1, 2, 4}));
}

// predict_step prices each kind of chunk pass once (the blocks, the
// embedding, the head, and in a Mixture of Experts which blocks are
// sparse). Stages 1 and 2 of four hold one block each and neither end of
// the model; layer 2 is sparse and layer 1 dense (moe_every 2), so their
// compute differs as their own kernels' seconds do (1F1B, zero 0, one
// tensor rank: a stage's compute is its micro-batches' forward and
// backward kernels, the shared factors cancelling in the ratio; 1e-12:
// rounding).
TEST(Plan, StagesAlikeButForTheirSparseBlocksArePricedApart) {
  Deck deck = tiny_deck();
  deck.model.experts = 4;
  deck.model.top_k = 2;
  deck.model.moe_every = 2;
  deck.model.capacity_factor = 2.0;
  deck.parallel.pp = 4;
  const MachineSpec m = workstation(8);
  const Prediction p = predict_step(deck, m, 4);
  ASSERT_TRUE(p.timed);
  auto kernels = [&](int s) {
    const auto [f, b] = kernel_seconds(m, deck.model, stage_range_of(deck, s, 0),
                                       deck.train.micro_batch, deck.train.recompute, 4);
    return f + b;
  };
  EXPECT_GT(kernels(2), 1.2 * kernels(1));
  EXPECT_NEAR(p.step.compute[2] / p.step.compute[1], kernels(2) / kernels(1), 1e-12);
}

// The planner's shared stage tables: one per (model, stage, replicas, ep),
// each what a fresh build gives; a field of the model, of the stage's
// range or the replicas that differs gives other tables (a key missing a
// field would hand one layout another's stage).
TEST(Plan, StageTablesAreSharedOnlyByTheSameStage) {
  const GptConfig cfg = gpt2_124m_shape();
  const StageRange range = partition_stage(cfg, 0, 2, 2, 0, 1);
  const auto a = stage_tables(cfg, range, 4, 1);
  EXPECT_EQ(stage_tables(cfg, range, 4, 1).get(), a.get());
  const ParameterTable fresh(cfg, range);
  const ShardPlan cuts(fresh, StageLayout(fresh, range), 4, 0, 1);
  EXPECT_EQ(a->table.total_storage(), fresh.total_storage());
  EXPECT_EQ(a->table.specs().size(), fresh.specs().size());
  EXPECT_EQ(a->layout.block_span(), StageLayout(fresh, range).block_span());
  EXPECT_EQ(a->shards().max_shard_size(), cuts.max_shard_size());
  EXPECT_EQ(a->shards().units().size(), cuts.units().size());
  GptConfig wider = cfg;
  wider.ffn_hidden = 4 * cfg.n_embd + 1024;
  StageRange last = range;
  last.has_head = true;
  StageRange other_rank = range;
  other_rank.tp_rank = 1;
  // An uneven interleaved cut's shortfalls, each changed alone.
  StageRange short_first = range, short_last = range;
  short_first.first_short = 1;
  short_last.last_short = 1;
  for (const auto& other : {stage_tables(wider, range, 4, 1), stage_tables(cfg, last, 4, 1),
                            stage_tables(cfg, other_rank, 4, 1), stage_tables(cfg, range, 8, 1),
                            stage_tables(cfg, short_first, 4, 1), stage_tables(cfg, short_last, 4, 1)}) {
    EXPECT_NE(other.get(), a.get());
  }
  EXPECT_GT(stage_tables(wider, range, 4, 1)->table.total_storage(), a->table.total_storage());
  EXPECT_LT(stage_tables(cfg, range, 8, 1)->shards().max_shard_size(), a->shards().max_shard_size());
  // Cuts that cannot be made are refused when asked for, not before (a
  // zero 0 layout asks for none).
  const auto uneven = stage_tables(cfg, range, 3, 2);
  EXPECT_EQ(uneven->table.total_storage(), fresh.total_storage());
  EXPECT_THROW(uneven->shards(), std::invalid_argument);
}

// The data-parallel reduction hides only in the backward's time that the
// context ring leaves its links. Against the same layout with a ring that
// takes no time: on the same links (one rank a node, every group across
// nodes) a slow ring cannot expose less of the reduction, its sends
// holding the links the reduction would use; on other links (the ring
// inside a node, the reduction across) the slow ring's longer backward
// hides more of it. Before, the reduction also hid behind the ring's own
// sends: the slow ring exposed 9e-5 s of it, the instant ring 4.4e-3.
// A small vocabulary: the embedding's reduction comes last, after the
// backward, and no backward hides it (124M's 50,257 rows would be most
// of what is exposed either way).
TEST(Plan, TheDataParallelReductionSharesItsLinksWithTheRing) {
  Deck deck = tiny_deck();
  deck.model = gpt2_124m_shape();
  deck.model.vocab_size = 256;
  deck.model.seq_len = 8192;
  deck.train.global_batch = 2;
  deck.train.micro_batch = 1;
  deck.train.precision = Precision::kBf16;
  deck.parallel.dp = 2;
  deck.parallel.cp = 2;
  deck.parallel.auto_layout = false;
  const MachineSpec gpu = load_machine(std::string(MPIFORMER_SOURCE_DIR) + "/inputs/machines/dgx-h100.toml");
  MachineSpec instant = gpu, slow = gpu;
  for (Link* l : {&instant.inter, &instant.intra}) {
    l->sendrecv.bandwidth *= 1e6;
    l->sendrecv.latency = 0;
  }
  for (Link* l : {&slow.inter, &slow.intra}) l->sendrecv.bandwidth /= 20;
  for (int per_node : {1, 2}) {
    const Prediction free_ring = predict_step(deck, instant, per_node);
    const Prediction slow_ring = predict_step(deck, slow, per_node);
    ASSERT_GT(slow_ring.cp_comm, 10 * free_ring.cp_comm) << per_node;
    ASSERT_GT(free_ring.exposed_comm, 1e-3) << per_node;  // the reduction outlasts the backward
    if (per_node == 1)
      EXPECT_GE(slow_ring.exposed_comm, free_ring.exposed_comm);
    else
      EXPECT_LT(slow_ring.exposed_comm, free_ring.exposed_comm);
  }
}

// Expert parallelism: each rank holds experts / ep of each sparse layer
// (less memory: its experts' weights, gradients and moments, at every
// ZeRO stage) and pays four all-to-alls per sparse layer; the search
// tries every ep dividing both dp and the experts, for a Mixture of
// Experts only.
TEST(Plan, ExpertParallelismIsPricedAndSearched) {
  Deck deck = tiny_deck();
  deck.model.experts = 8;
  deck.model.top_k = 2;
  deck.parallel.dp = 4;
  deck.train.micro_batch = 8;
  const MachineSpec m = workstation(1);
  for (int64_t zero : {0, 1, 3}) {
    deck.parallel.zero = zero;
    deck.parallel.ep = 1;
    const Prediction one = predict_step(deck, m, 4);
    deck.parallel.ep = 4;
    const Prediction four = predict_step(deck, m, 4);
    EXPECT_LT(four.memory_max, one.memory_max) << "zero " << zero;
    EXPECT_LT(four.memory[0].parameters(), one.memory[0].parameters()) << "zero " << zero;
    EXPECT_EQ(one.ep_comm, 0);
    EXPECT_GT(four.ep_comm, 0);
    EXPECT_EQ(four.layout.describe(), one.layout.describe() + " ep 4");
    // Priced at the capacity factor's bound (1.25) unless the deck says;
    // no rank can be sent more than its experts' capacity.
    EXPECT_EQ(four.expert_imbalance, 1.25);
    deck.parallel.expert_imbalance = 2;
    EXPECT_EQ(predict_step(deck, m, 4).step.step_time, four.step.step_time);
    deck.parallel.expert_imbalance = 0;
  }
  // Dropless: balanced unless the deck says (a run's expert_load_max).
  deck.model.capacity_factor = 0;
  const Prediction even = predict_step(deck, m, 4);
  EXPECT_EQ(even.expert_imbalance, 1);
  deck.parallel.expert_imbalance = 2;
  const Prediction busy = predict_step(deck, m, 4);
  EXPECT_GT(busy.ep_comm, even.ep_comm);  // (latency-bound at this size)
  EXPECT_GT(busy.compute, even.compute);
  deck.model.capacity_factor = 1.25;
  deck.parallel.expert_imbalance = 0;
  int64_t most = 1;
  const Plan all = plan_layouts(deck, m, 4, 4);
  // (ep groups are of the stage's replicas: dp x cp, context ranks too.)
  bool over_context = false;
  for (const Prediction& p : all.fitting) {
    EXPECT_EQ(p.layout.dp * p.layout.cp % p.layout.ep, 0) << p.layout.describe();
    over_context = over_context || p.layout.dp % p.layout.ep != 0;
    EXPECT_EQ(deck.model.experts % p.layout.ep, 0) << p.layout.describe();
    most = std::max(most, p.layout.ep);
  }
  EXPECT_EQ(most, 4);
  EXPECT_TRUE(over_context);  // some ep group spans context ranks
  for (const Prediction& p : plan_layouts(tiny_deck(), m, 4, 4).fitting)
    EXPECT_EQ(p.layout.ep, 1) << p.layout.describe();
}

TEST(Plan, AModelThatFitsNowhereIsRefusedWithWhatItNeeds) {
  Deck deck = tiny_deck();
  deck.model = GptConfig{12, 12, 768, 1024, 50257};
  deck.train.global_batch = 8;
  deck.train.micro_batch = 1;
  const MachineSpec m = workstation(0.25);
  const Plan plan = plan_layouts(deck, m, 2, 2);
  ASSERT_TRUE(plan.fitting.empty());
  // The leanest layout keeps the fewest activations: one sequence a
  // micro-batch, everything recomputed.
  EXPECT_EQ(plan.leanest.layout.micro_batch, 1) << plan.leanest.layout.describe();
  EXPECT_EQ(plan.leanest.layout.recompute, Recompute::kFull);
  const std::string why = plan_refusal(deck, m, plan);
  const double gib = 1024.0 * 1024 * 1024;
  char need[64];
  std::snprintf(need, sizeof need, "needs at least %.1f GiB per rank", plan.leanest.memory_max / gib);
  EXPECT_NE(why.find(need), std::string::npos) << why;
  EXPECT_NE(why.find("gives 0.25 GiB per rank, of which 0.23 GiB are planned ([parallel] "
                     "memory_margin = 0.1"),
            std::string::npos)
      << why;
  // 7 ranks of the tiny model: tp 1 (7 divides no head count of 4), pp 1
  // (7 > 4 layers), so dp 7, which does not divide its batch of 32.
  EXPECT_THROW(plan_layouts(tiny_deck(), m, 7, 7), InputError);
}

// Layouts priced side by side give the plan of one thread, in the same
// order; the progress report counts every layout and names the fastest
// fitting one so far.
TEST(Plan, ThreadsChangeNothingAndProgressIsReported) {
  const Deck deck = tiny_deck();
  const MachineSpec m = workstation(1);
  const Plan one = plan_layouts(deck, m, 4, 4);
  PlanOptions options;
  options.threads = 3;
  options.report_every = std::chrono::duration<double>(0);
  int reports = 0, last_done = 0;
  double best_rate = 0;
  options.progress = [&](int done, int total, double, const Prediction* best) {
    ++reports;
    EXPECT_EQ(done, last_done + 1);
    last_done = done;
    EXPECT_EQ(total, one.considered);
    if (best != nullptr) {
      EXPECT_GE(best->tokens_per_s, best_rate);
      best_rate = best->tokens_per_s;
    }
  };
  const Plan three = plan_layouts(deck, m, 4, 4, options);
  EXPECT_EQ(reports, one.considered);
  EXPECT_EQ(best_rate, one.fitting.front().tokens_per_s);
  ASSERT_EQ(three.fitting.size(), one.fitting.size());
  EXPECT_EQ(three.considered, one.considered);
  for (size_t i = 0; i < one.fitting.size(); ++i) {
    EXPECT_EQ(three.fitting[i].layout.describe(), one.fitting[i].layout.describe());
    EXPECT_EQ(three.fitting[i].tokens_per_s, one.fitting[i].tokens_per_s);
  }
  EXPECT_EQ(three.leanest.layout.describe(), one.leanest.layout.describe());
}

// A search that keeps its fastest few simulates only the layouts that
// could be among them (step_time_floor), and finds the same few, in the
// same order, with the same figures, as one that simulates every layout.
TEST(Plan, AKeptFewAreTheFastestOfAll) {
  const Deck deck = tiny_deck();
  const MachineSpec m = workstation(1);
  const Plan all = plan_layouts(deck, m, 8, 8);
  EXPECT_EQ(all.timed, all.fit);
  ASSERT_GE(all.fitting.size(), 3u);
  for (const int threads : {1, 3}) {
    PlanOptions options;
    options.threads = threads;
    options.keep = 3;
    const Plan few = plan_layouts(deck, m, 8, 8, options);
    EXPECT_EQ(few.considered, all.considered);
    EXPECT_EQ(few.fit, all.fit);
    EXPECT_LT(few.timed, all.timed / 2) << "most layouts cannot win";
    ASSERT_EQ(few.fitting.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(few.fitting[i].layout.describe(), all.fitting[i].layout.describe());
      EXPECT_EQ(few.fitting[i].tokens_per_s, all.fitting[i].tokens_per_s);
      EXPECT_EQ(few.fitting[i].memory_max, all.fitting[i].memory_max);
    }
    EXPECT_EQ(few.leanest.layout.describe(), all.leanest.layout.describe());
  }
}

// The planner never recommends a layout above its margin: with the leanest
// layout's need between 90% and 100% of a rank's memory, nothing fits at
// the default margin of 10%, and it does at none.
TEST(Plan, LayoutsKeepTheMemoryMargin) {
  Deck deck = tiny_deck();
  const MachineSpec roomy = workstation(1);
  const Plan all = plan_layouts(deck, roomy, 2, 2);
  ASSERT_FALSE(all.fitting.empty());
  double leanest = all.leanest.memory_max;
  const MachineSpec m = workstation(leanest / 0.95 / (1024.0 * 1024 * 1024));
  EXPECT_TRUE(plan_layouts(deck, m, 2, 2).fitting.empty());
  deck.parallel.memory_margin = 0;
  const Plan none = plan_layouts(deck, m, 2, 2);
  ASSERT_FALSE(none.fitting.empty());
  for (const Prediction& p : none.fitting) EXPECT_LE(p.memory_max, p.memory_available);
  deck.parallel.memory_margin = 0.5;
  const Plan half = plan_layouts(deck, roomy, 2, 2);
  for (const Prediction& p : half.fitting) EXPECT_LE(p.memory_max, 0.5 * p.memory_available);
}

// A machine file's rates are of one precision: a deck of another is
// refused by name, not priced at those rates; a file that does not say
// prices any.
TEST(Plan, RatesOfAnotherPrecisionAreRefused) {
  Deck deck = tiny_deck();
  MachineSpec m = workstation(1);
  m.path = "bf16.toml";
  m.precision = Precision::kBf16;
  try {
    plan_layouts(deck, m, 2, 2);
    ADD_FAILURE() << "an fp32 deck planned with bf16 rates";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bf16.toml: [compute] precision"), std::string::npos) << what;
    EXPECT_NE(what.find("--precision fp32"), std::string::npos) << what;
  }
  EXPECT_THROW(predict_step(deck, m, 1), InputError);  // --as-given and [parallel] auto too
  deck.train.precision = Precision::kBf16;
  EXPECT_FALSE(plan_layouts(deck, m, 2, 2).fitting.empty());
  m.precision.reset();
  deck.train.precision = Precision::kFp16;
  EXPECT_FALSE(plan_layouts(deck, m, 2, 2).fitting.empty());
}

// [data] document_mask: a GPU's attention priced at the share of the
// causal pairs the mask keeps (its kernels skip the rest); the host's
// attention computes every causal tile, so its price stays.
TEST(Plan, TheDocumentMaskPricesAGpusAttentionAtWhatItKeeps) {
  Deck deck = tiny_deck();
  deck.model = GptConfig{4, 16, 2048, 2048, 51200};
  deck.train.global_batch = 64;
  deck.train.micro_batch = 1;
  deck.train.precision = Precision::kBf16;
  const auto attention = [](const Prediction& p) {
    double t = 0;
    for (const auto& [name, s] : p.kernels)
      if (name.rfind("attention", 0) == 0) t += s;
    return t;
  };
  const MachineSpec gpu = load_machine(std::string(MPIFORMER_SOURCE_DIR) + "/inputs/machines/dgx-h100.toml");
  deck.parallel.dp = 8;
  deck.parallel.auto_layout = false;
  const Prediction plain = predict_step(deck, gpu, 8);
  deck.data.document_mask = true;
  deck.data.attention_kept = 0.25;
  const Prediction masked = predict_step(deck, gpu, 8);
  ASSERT_GT(attention(plain), 0);
  EXPECT_NEAR(attention(masked), 0.25 * attention(plain), 1e-9 * attention(plain));
  EXPECT_GT(masked.tokens_per_s, plain.tokens_per_s);
  deck = tiny_deck();
  const MachineSpec host = workstation(8);
  const Prediction host_plain = predict_step(deck, host, 1);
  deck.data.document_mask = true;
  deck.data.attention_kept = 0.25;
  EXPECT_EQ(attention(predict_step(deck, host, 1)), attention(host_plain));
}

// The shipped machine files read, and plan a GPT-3 XL-sized model (the
// rates are bf16's) on one node of each.
TEST(Plan, TheShippedMachineFilesPlan) {
  Deck deck = tiny_deck();
  deck.model = GptConfig{24, 16, 2048, 2048, 51200};
  deck.train.global_batch = 512;
  deck.train.micro_batch = 1;
  deck.train.precision = Precision::kBf16;
  for (const char* name : {"dgx-a100-80gb.toml", "dgx-h100.toml"}) {
    const MachineSpec m = load_machine(std::string(MPIFORMER_SOURCE_DIR) + "/inputs/machines/" + name);
    EXPECT_EQ(m.device, Device::kCuda) << name;
    EXPECT_EQ(m.devices_per_node, 8) << name;
    EXPECT_TRUE(m.has_inter) << name;
    const Plan plan = plan_layouts(deck, m, 8);
    ASSERT_FALSE(plan.fitting.empty()) << name;
    EXPECT_GT(plan.fitting.front().mfu, 0.1) << name;
    EXPECT_LT(plan.fitting.front().mfu, 1.0) << name;
  }
}

// [train] offload: in bf16 the moments and the float masters leave the
// device's memory (12 of its 18 bytes a parameter), AdamW runs on the
// host, and the step pays the slowest of the host's update, the host link
// (gradients down, the bf16 copy up: 6 bytes) and the disk the node's
// ranks share; a machine file that cannot price it is named; and the
// search offloads when nothing else fits.
TEST(Plan, OffloadIsPricedAndChosenWhenNothingElseFits) {
  MachineSpec m = load_machine(std::string(MPIFORMER_SOURCE_DIR) + "/inputs/machines/h200-single.toml");
  Deck deck = tiny_deck();
  // About 8.3 G parameters: 18 bytes each in bf16 (weights, float
  // gradients, masters, moments) overflow 139 GiB; without the masters'
  // and moments' 12, they fit.
  deck.model = GptConfig{40, 32, 4096, 2048, 50304};
  deck.train.global_batch = 8;
  deck.train.micro_batch = 1;
  deck.train.precision = Precision::kBf16;
  deck.train.recompute = Recompute::kFull;
  const Prediction none = predict_step(deck, m, 1, false);
  EXPECT_FALSE(none.fits);
  Deck off = deck;
  off.train.offload = Offload::kHost;
  const Prediction host = predict_step(off, m, 1, false);
  EXPECT_TRUE(host.fits);
  const double n = static_cast<double>(
      ParameterTable(deck.model, StageRange{0, deck.model.n_layer, true, true}).total_storage());
  EXPECT_NEAR(none.memory[0].optimizer, 8 * n, 1e-9 * n);
  EXPECT_NEAR(none.memory[0].stage.parameters, 4 * n, 1e-9 * n);
  EXPECT_EQ(host.memory[0].optimizer, 0.0);
  EXPECT_EQ(host.memory[0].stage.parameters, 0.0);        // the masters left too
  EXPECT_NEAR(host.memory[0].stage.weight_copy, 2 * n, 1e-9 * n);  // the bf16 copy stayed
  EXPECT_EQ(host.memory[0].offload_buffers, 0.0);         // nothing of it on the device
  // The state, and the page-locked blocks: two of gradients, two of the copy.
  const double block = static_cast<double>(offload_block_elements(off.train));
  EXPECT_NEAR(host.memory[0].offload_host, 12 * n + block * (8 + 4), 1e-9 * n);
  // With data parallelism (zero 0) the whole gradients too: they come down
  // bucket by bucket during backward.
  Deck dp2 = off;
  dp2.parallel.dp = 2;
  EXPECT_NEAR(predict_step(dp2, m, 2, false).memory[0].offload_host,
              16 * n + block * (8 + 4), 1e-9 * n);
  // The host's update at 80 GB/s (28 bytes an element) paces the step:
  // the link's 6 bytes at 48 GB/s hide behind it.
  EXPECT_NEAR(host.optimizer, 28 * n / 80e9, 0.02 * host.optimizer);
  // A faster host: the link paces it.
  MachineSpec fast = m;
  fast.host_adamw_bandwidth = 1e15;
  EXPECT_NEAR(predict_step(off, fast, 1, false).optimizer, 6 * n / 48e9, 1e-6 * n / 48e9);
  // With data parallelism the gradients came down during backward: the
  // step's link carries the 2 bytes going up.
  EXPECT_NEAR(predict_step(dp2, fast, 2, false).optimizer, 2 * n / 48e9, 1e-3 * n / 48e9);
  // nvme needs the disk's rates, which this file does not have.
  off.train.offload = Offload::kNvme;
  try {
    predict_step(off, m, 1, false);
    ADD_FAILURE() << "nvme priced without the disk's rates";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("[offload] disk_read_gbs"), std::string::npos) << e.what();
  }
  // The search: nothing fits on the device alone, so it offloads.
  const Plan plan = plan_layouts(deck, m, 1);
  ASSERT_FALSE(plan.fitting.empty());
  for (const Prediction& p : plan.fitting) EXPECT_EQ(p.layout.offload, Offload::kHost);
  EXPECT_NE(plan.fitting.front().layout.describe().find("offload host"), std::string::npos);
  // A machine file that cannot price it: named, and nothing offered.
  m.host_adamw_bandwidth = 0;
  off.train.offload = Offload::kHost;
  try {
    predict_step(off, m, 1, false);
    ADD_FAILURE() << "host offload priced without the host's AdamW rate";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("[offload] host_adamw_gbs"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(plan_layouts(deck, m, 1).fitting.empty());
  m.host_adamw_bandwidth = 80e9;
  m.host_link_bandwidth = 0;
  EXPECT_TRUE(plan_layouts(deck, m, 1).fitting.empty());
}

// nvme: the step pays the state's bytes (bf16: moments and masters) read
// and written on the disk, times the node's ranks that share it, when it
// is slower than the update and the link.
TEST(Plan, NvmeOffloadPaysTheSharedDisk) {
  MachineSpec m = load_machine(std::string(MPIFORMER_SOURCE_DIR) + "/inputs/machines/dgx-h100.toml");
  m.disk_read_bandwidth = 2e9;
  m.disk_write_bandwidth = 1e9;
  Deck deck = tiny_deck();
  deck.model = GptConfig{24, 16, 1024, 1024, 50304};
  deck.train.global_batch = 64;
  deck.train.micro_batch = 1;
  deck.train.precision = Precision::kBf16;
  deck.parallel.dp = 8;
  deck.parallel.zero = 1;
  deck.train.offload = Offload::kNvme;
  deck.train.offload_dir = "/local";
  const Prediction p = predict_step(deck, m, 8, false);
  const double state = 3.0 * 4 * static_cast<double>(
      ShardPlan(ParameterTable(deck.model, StageRange{0, 24, true, true}),
                StageLayout(ParameterTable(deck.model, StageRange{0, 24, true, true}),
                            StageRange{0, 24, true, true}), 8, 0).max_shard_size());
  const double disk = state * 8 * (1 / 2e9 + 1 / 1e9);
  EXPECT_NEAR(p.optimizer, disk, 1e-6 * p.optimizer);
  EXPECT_NEAR(p.memory[0].offload_disk, state, 1e-9 * state);
}

}  // namespace
}  // namespace mpiformer::test
