// Ring attention over MPI (train/ring_attention.hpp) at 1, 2 and 4 ranks
// (mpi.ring_attention.npN): every rank holds its two chunks (head-tail, or contiguous) of
// the same sequences; its output and its rows of dqkv against host
// attention over the whole sequence, computed on every rank alike
// (host/attention.hpp: the trainer's own kernel, sharing no code with the
// ring's blockwise arithmetic). Grouped-query heads, two sequences, chunks
// of 5 tokens, whole or in query tiles of 2. Tolerance: float both, 2e-5 of each result's largest value
// (another order of the same sums).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "host/attention.hpp"
#include "host/ops.hpp"
#include "plan/rank_memory.hpp"
#include "train/context_attention.hpp"
#include "train/ring_attention.hpp"
#include "parallel/mpi_communicator.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

// Either chunk order ([parallel] cp_chunks): the same attention.
class RingAttentionOrder : public ::testing::TestWithParam<ContextChunks> {};

TEST_P(RingAttentionOrder, ChunksAroundTheRanksMatchWholeSequenceAttention) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MpiCommunicator ring(c);
  const int cp = ring.size(), r = ring.rank();
  const host::AttentionShape a{2, 16, 4, 2};
  const int64_t n = 5, T = 2 * cp * n, K = a.K(), ld = a.C + 2 * K;
  // The whole sequences, the same on every rank.
  const std::vector<float> qkv = cast<float>(random_vector(a.B * T * ld, 11)),
                           dout = cast<float>(random_vector(a.B * T * a.C, 12));
  std::vector<float> out(a.B * T * a.C), att(a.B * a.NH * T * T), dqkv(a.B * T * ld), datt(att.size());
  host::attention_forward(out.data(), att.data(), qkv.data(), a.B, T, a.C, a.NH, a.NKV);
  host::attention_backward(dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(), a.B, T, a.C, a.NH,
                           a.NKV);
  host::Context ctx;
  RingAttention<host::Ops<float>> ring_attention(ctx, ring, a, n, GetParam());
  // And with query tiles of 2 rows: 2, 2 and a short 1 per chunk.
  RingAttention<host::Ops<float>> tiled(ctx, ring, a, n, GetParam(), 2);
  // This rank's rows, chunk-major [2, B, n, width], from [B, T, width].
  auto mine = [&](const std::vector<float>& x, int64_t width) {
    std::vector<float> y(2 * a.B * n * width);
    for (int j = 0; j < 2; ++j)
      for (int64_t b = 0; b < a.B; ++b)
        std::copy_n(x.data() + (b * T + ring_attention.chunk_start(r, j)) * width, n * width,
                    y.data() + ((j * a.B + b) * n) * width);
    return y;
  };
  const std::vector<float> my_qkv = mine(qkv, ld), my_dout = mine(dout, a.C);
  std::vector<float> my_out(2 * a.B * n * a.C), lse(2 * a.B * a.NH * n), my_dqkv(my_qkv.size());
  ring_attention.forward(my_qkv.data(), my_out.data(), lse.data());
  ring_attention.backward(my_qkv.data(), my_out.data(), lse.data(), my_dout.data(), my_dqkv.data());
  const std::string where = "cp " + std::to_string(cp) + " rank " + std::to_string(r) + ", " +
                            name_of(GetParam()) + " chunks";
  EXPECT_TRUE(close_to_largest(my_out, mine(out, a.C), 2e-5)) << where << ": out";
  EXPECT_TRUE(close_to_largest(my_dqkv, mine(dqkv, ld), 2e-5)) << where << ": dqkv";
  tiled.forward(my_qkv.data(), my_out.data(), lse.data());
  tiled.backward(my_qkv.data(), my_out.data(), lse.data(), my_dout.data(), my_dqkv.data());
  EXPECT_TRUE(close_to_largest(my_out, mine(out, a.C), 2e-5)) << where << ", tiles of 2: out";
  EXPECT_TRUE(close_to_largest(my_dqkv, mine(dqkv, ld), 2e-5)) << where << ", tiles of 2: dqkv";
}

INSTANTIATE_TEST_SUITE_P(Orders, RingAttentionOrder,
                         ::testing::Values(ContextChunks::kHeadTail, ContextChunks::kContiguous));

// The memory accounting's count of the ring's buffers (and a 16-bit
// stage's float copies) is what the trainer's ring allocates: Llama's
// grouped-query widths, with and without tensor parallelism.
TEST(RingAttention, TheAccountingCountsWhatTheRingHolds) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MpiCommunicator ring(c);
  GptConfig cfg;
  cfg.family = ModelFamily::kLlama;
  cfg.n_head = 6;
  cfg.n_kv_head = 2;
  cfg.n_embd = 48;
  cfg.seq_len = 24;
  const int64_t cp = ring.size();
  if (cp == 1) return;  // no ring to count: the trainer builds none at cp 1
  for (int64_t tp : {1, 2}) {
    host::Context ctx;
    const ContextAttention<host::Ops<float>> fp32(ctx, ring, cfg, tp, 3, ContextChunks::kHeadTail, nullptr);
    const ContextAttention<host::Ops<host::Bf16>> bf16(ctx, ring, cfg, tp, 3, ContextChunks::kHeadTail,
                                                       nullptr);
    EXPECT_EQ(fp32.allocated_bytes(), context_attention_bytes(cfg, tp, 3, cp, 4, 4)) << "tp " << tp;
    EXPECT_EQ(bf16.allocated_bytes(), context_attention_bytes(cfg, tp, 3, cp, 2, 4)) << "tp " << tp;
  }
}

// A bf16 stage's ring passes its key/value blocks in bf16 (half float's
// bytes): the values it holds are bf16's, so nothing is lost. Its
// results are bit for bit the float ring's on the same values, rounded
// once to bf16: the output, and dqkv (and lse, float in both).
TEST(RingAttention, SixteenBitBlocksLoseNothing) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MpiCommunicator ring(c);
  const int64_t cp = ring.size();
  if (cp == 1) return;
  GptConfig cfg;
  cfg.family = ModelFamily::kLlama;
  cfg.n_head = 4;
  cfg.n_kv_head = 2;
  cfg.n_embd = 32;
  cfg.seq_len = 2 * cp * 7;
  const int64_t B = 2, rows = B * cfg.seq_len / cp, width = cfg.qkv_dim_per_rank(1), C = cfg.n_embd;
  host::Context ctx;
  ContextAttention<host::Ops<float>> fp32(ctx, ring, cfg, 1, B, ContextChunks::kHeadTail, nullptr);
  ContextAttention<host::Ops<host::Bf16>> bf16(ctx, ring, cfg, 1, B, ContextChunks::kHeadTail, nullptr);
  // bf16 values, and the same as floats.
  auto values = [&](int64_t n, unsigned seed, std::vector<host::Bf16>& narrow, std::vector<float>& wide) {
    const std::vector<double> v = random_vector(n, seed + 7 * static_cast<unsigned>(ring.rank()));
    for (double x : v) {
      narrow.push_back(host::Bf16(static_cast<float>(x)));
      wide.push_back(static_cast<float>(narrow.back()));
    }
  };
  std::vector<host::Bf16> qkv16, dout16;
  std::vector<float> qkv, dout;
  values(rows * width, 31, qkv16, qkv);
  values(rows * C, 32, dout16, dout);
  std::vector<float> out(rows * C), lse(rows * cfg.n_head), dqkv(rows * width);
  std::vector<float> lse16(lse.size());
  std::vector<host::Bf16> out16(out.size()), dqkv16(dqkv.size());
  ContextGroup f = fp32.group(), h = bf16.group();
  f.forward(qkv.data(), out.data(), lse.data(), nullptr);
  h.forward(qkv16.data(), out16.data(), lse16.data(), nullptr);
  // The float ring's backward from its own output rounded as bf16's was.
  std::vector<float> out_rounded(out.size());
  for (size_t i = 0; i < out.size(); ++i) out_rounded[i] = static_cast<float>(host::Bf16(out[i]));
  f.backward(qkv.data(), out_rounded.data(), lse.data(), dout.data(), dqkv.data(), nullptr);
  h.backward(qkv16.data(), out16.data(), lse16.data(), dout16.data(), dqkv16.data(), nullptr);
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_EQ(out16[i].bits, host::Bf16(out[i]).bits) << "out " << i;
  for (size_t i = 0; i < lse.size(); ++i) ASSERT_EQ(lse16[i], lse[i]) << "lse " << i;
  for (size_t i = 0; i < dqkv.size(); ++i)
    ASSERT_EQ(dqkv16[i].bits, host::Bf16(dqkv[i]).bits) << "dqkv " << i;
}

}  // namespace
}  // namespace mpiformer::test
