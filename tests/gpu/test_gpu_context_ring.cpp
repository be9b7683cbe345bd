// Context-parallel attention on the GPU's op set (train/context_attention.hpp
// over cuda/ring_attention.hpp's kernels) against the same ring on the
// host's op set, which mpi.ring_attention holds to whole-sequence
// attention and e2e.context_parallel to one-rank training: each rank of
// the context group (2 or 4) hands both the same rows. The GPU's ring
// moves its blocks through the host-staged communicator (ranks sharing
// one GPU). A Llama-like grouped-query shape, chunks of 37 tokens (the
// kernels take keys 32 at a time), with and without documents, fp32 and
// bf16 rows. Then the whole stage on the CUDA op set at cp ranks, its
// context group on that ring, against the whole sequences in double on
// the host (every rank computing the reference alone): the loss and the
// gradients summed over the group, both families, dense and a Mixture of
// Experts (its router's counts gathered over the group on the device). Runs on a GPU
// (gpu.context_ring) and under the CPU emulation
// (mpi.emulated_context_ring). Exits 77 without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bf16.hpp"
#include "core/cuda_check.hpp"
#include "cuda/device.hpp"
#include "cuda/ops.hpp"
#include "device_copy.hpp"
#include "host/ops.hpp"
#include "parallel/host_staged_communicator.hpp"
#include "parallel/mpi_communicator.hpp"
#include "model/gpt_stage.hpp"
#include "model/stage_footprint.hpp"
#include "plan/rank_memory.hpp"
#include "train/context_attention.hpp"

namespace mpiformer::test {
namespace {

// One element type on both sides: its bits, and what it holds as a float.
template <class H>
struct Elements {
  std::vector<H> host;
  std::vector<float> value;
};
template <class H>
Elements<H> random_elements(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Elements<H> e;
  for (size_t i = 0; i < n; ++i) {
    const float x = dist(gen);
    if constexpr (std::is_same_v<H, float>) {
      e.host.push_back(x);
    } else {
      e.host.push_back(H(x));
    }
    e.value.push_back(static_cast<float>(e.host.back()));
  }
  return e;
}
template <class H>
std::vector<float> values(const std::vector<H>& x) {
  std::vector<float> v;
  for (const H& e : x) v.push_back(static_cast<float>(e));
  return v;
}

// A device array holding the host elements' bits (Bf16 and cuda::bf16
// share them).
template <class D, class H>
cuda::DeviceBuffer<D> upload(const std::vector<H>& x) {
  static_assert(sizeof(D) == sizeof(H));
  cuda::DeviceBuffer<D> d(x.size());
  cuda::copy_to_device(d.get(), x.data(), x.size() * sizeof(H));
  return d;
}
template <class D, class H>
std::vector<float> download(const cuda::DeviceBuffer<D>& d) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<H> h(d.size());
  cuda::copy_to_host(h.data(), d.get(), d.size() * sizeof(D));
  return values(h);
}

::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double tol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i]))))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << " against " << want[i] << " (tolerance " << tol << ")";
  return ::testing::AssertionSuccess();
}

// Which chunk of 2 cp context rank r holds as its j-th (head-tail).
int64_t attention_chunk(int r, int cp, int j) { return j == 0 ? r : 2 * cp - 1 - r; }

// H: the host's element type, D: the GPU's (the same bits).
template <class H, class D>
void check_ring(bool documents, double tol) {
  MPI_Comm host_dup = MPI_COMM_NULL, staged_dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &host_dup);
  MPI_Comm_dup(MPI_COMM_WORLD, &staged_dup);
  {
    MpiCommunicator host_ring(host_dup), staged_group(staged_dup);
    cuda::Context ctx(0);
    HostStagedCommunicator device_ring(staged_group, ctx.stream());
    const int cp = host_ring.size(), r = host_ring.rank();
    SCOPED_TRACE("cp " + std::to_string(cp) + " rank " + std::to_string(r) +
                 (documents ? ", documents" : "") + (std::is_same_v<H, float> ? ", fp32" : ", bf16"));
    GptConfig cfg;
    cfg.family = ModelFamily::kLlama;
    cfg.n_head = 4;
    cfg.n_kv_head = 2;
    cfg.n_embd = 64;
    const int64_t n = 37, B = 2;
    cfg.seq_len = 2 * cp * n;
    host::Context hctx;
    ContextAttention<host::Ops<H>> on_host(hctx, host_ring, cfg, 1, B, ContextChunks::kHeadTail, nullptr);
    ContextAttention<cuda::Ops<D>> on_gpu(ctx, device_ring, cfg, 1, B, ContextChunks::kHeadTail, nullptr);
    ContextGroup hg = on_host.group(), dg = on_gpu.group();
    const int64_t rows = 2 * B * n, C = cfg.n_embd, width = cfg.qkv_dim_per_rank(1);
    const unsigned seed = 100 + static_cast<unsigned>(r);
    const Elements<H> qkv = random_elements<H>(static_cast<size_t>(rows * width), seed);
    const Elements<H> dout = random_elements<H>(static_cast<size_t>(rows * C), seed + 50);
    // Documents of 13 tokens: each row's position in its document, from
    // its place in the sequence (head-tail chunks r and 2 cp - 1 - r).
    std::vector<int32_t> positions(static_cast<size_t>(rows));
    for (int j = 0; j < 2; ++j)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t) {
          const int64_t chunk = attention_chunk(r, cp, j);
          positions[static_cast<size_t>((j * B + b) * n + t)] = static_cast<int32_t>((chunk * n + t) % 13);
        }
    cuda::DeviceBuffer<int32_t> dpos(positions.size());
    cuda::copy_to_device(dpos.get(), positions.data(), positions.size() * sizeof(int32_t));
    const int32_t* hp = documents ? positions.data() : nullptr;
    const int32_t* dp = documents ? dpos.get() : nullptr;

    std::vector<H> out(static_cast<size_t>(rows * C)), dqkv(static_cast<size_t>(rows * width));
    std::vector<float> lse(static_cast<size_t>(rows * cfg.n_head));
    hg.forward(qkv.host.data(), out.data(), lse.data(), hp);
    hg.backward(qkv.host.data(), out.data(), lse.data(), dout.host.data(), dqkv.data(), hp);

    auto dqkv_in = upload<D>(qkv.host), ddout = upload<D>(dout.host);
    cuda::DeviceBuffer<D> dout_rows(out.size()), ddqkv(dqkv.size());
    cuda::DeviceBuffer<float> dlse(lse.size());
    dg.forward(dqkv_in.get(), dout_rows.get(), dlse.get(), dp);
    EXPECT_TRUE(close(download<D, H>(dout_rows), values(out), tol)) << "out";
    EXPECT_TRUE(close(download<float, float>(dlse), lse, 1e-5)) << "lse";
    dg.backward(dqkv_in.get(), dout_rows.get(), dlse.get(), ddout.get(), ddqkv.get(), dp);
    EXPECT_TRUE(close(download<D, H>(ddqkv), values(dqkv), tol)) << "dqkv";
  }
  MPI_Comm_free(&host_dup);
  MPI_Comm_free(&staged_dup);
}

// fp32: both rings sum in float in other orders (the GPU per 32 keys,
// the host per block): 1e-5. bf16: the GPU's tiles round the
// probabilities and the scores' gradients to bf16 as their products'
// operands (2^-8 relative, averaging out over the keys), and both round
// their results to bf16: 1e-2.
TEST(ContextRing, TheGpuRingMatchesTheHostRing) {
  check_ring<float, float>(false, 1e-5);
  check_ring<float, float>(true, 1e-5);
  check_ring<host::Bf16, cuda::bf16>(true, 1e-2);
}

// The whole model at cp ranks on the GPU's op set against one rank's
// whole sequences in double on the host: kB sequences of 4 cp chunks of
// 5 tokens, two micro-batches accumulated. Tolerances as gpu.stage's
// (tests/gpu/test_gpu_stage.cpp): fp32's loss 1e-5 relative and each
// gradient within 1e-4 of its tensor's largest plus 1e-4 relative.
void check_stage(const GptConfig& base) {
  MPI_Comm staged_dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &staged_dup);
  {
    MpiCommunicator staged_group(staged_dup);
    const int cp = staged_group.size(), r = staged_group.rank();
    constexpr int64_t kB = 2, n = 5;
    GptConfig cfg = base;
    cfg.seq_len = 2 * cp * n;
    const int64_t T = cfg.seq_len;
    SCOPED_TRACE(std::string(cfg.llama() ? "llama" : "gpt-2") + ", cp " + std::to_string(cp) + " rank " +
                 std::to_string(r));
    const StageRange whole{0, cfg.n_layer, true, true};
    std::mt19937 gen(3);
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(cfg.vocab_size) - 1);
    std::vector<std::vector<int32_t>> in(2), tg(2);
    for (int m = 0; m < 2; ++m)
      for (int64_t i = 0; i < kB * T; ++i) {
        in[m].push_back(token(gen));
        tg[m].push_back(token(gen));
      }
    const double scale = 1.0 / static_cast<double>(2 * kB * T);

    cuda::Context ctx(0);
    HostStagedCommunicator ring(staged_group, ctx.stream());
    StageOptions o{kB, 2};
    o.cp = cp;
    GptStage<cuda::Ops<float>> gpu(ctx, cfg, whole, o);
    ContextAttention<cuda::Ops<float>> attention(ctx, ring, cfg, 1, kB, ContextChunks::kHeadTail, nullptr);
    // The accounting counts what the GPU's stage and ring allocate.
    EXPECT_EQ(static_cast<double>(gpu.allocated_bytes()),
              stage_footprint(cfg, whole, o, 4, 4, AttentionStorage::kRowStatistics).total());
    EXPECT_EQ(attention.allocated_bytes(), context_attention_bytes(cfg, 1, kB, cp, 4, 4, Device::kCuda));
    gpu.set_context_group(attention.group());
    gpu.init_parameters(7);
    std::vector<float> params(static_cast<size_t>(gpu.param_storage()));
    cuda::Ops<float>::download(ctx, params.data(), gpu.params(), gpu.param_storage());

    host::Context hctx;
    HostGptStage<double> ref(hctx, cfg, whole, StageOptions{kB, SlotKinds::any(1)});
    std::copy(params.begin(), params.end(), ref.params());
    ref.zero_grads();
    for (int m = 0; m < 2; ++m) {
      ref.forward(0, in[m].data(), tg[m].data(), true, scale, 0, nullptr);
      ref.backward(0);
    }
    const double want_loss = ref.take_loss_sum();

    // This rank's rows, chunk-major [2, kB, n], with their positions.
    const auto mine = [&](const std::vector<int32_t>& x) {
      std::vector<int32_t> y;
      for (int j = 0; j < 2; ++j)
        for (int64_t b = 0; b < kB; ++b)
          for (int64_t t = 0; t < n; ++t) y.push_back(x[b * T + attention_chunk(r, cp, j) * n + t]);
      return y;
    };
    std::vector<int32_t> positions;
    for (int j = 0; j < 2; ++j)
      for (int64_t b = 0; b < kB; ++b)
        for (int64_t t = 0; t < n; ++t) positions.push_back(static_cast<int32_t>(attention_chunk(r, cp, j) * n + t));
    gpu.zero_grads();
    for (int m = 0; m < 2; ++m) {
      const std::vector<int32_t> my_in = mine(in[m]), my_tg = mine(tg[m]);
      gpu.forward(m, my_in.data(), my_tg.data(), true, static_cast<float>(scale), 0, positions.data());
    }
    for (int m = 1; m >= 0; --m) gpu.backward(m);
    double loss = gpu.take_loss_sum();
    MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, staged_dup);
    EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
    if (cfg.moe()) {
      // The router's decisions, summed over the group, are one rank's:
      // the same assignments dropped and each expert's rows, exactly; the
      // aux and z losses' sums within the loss's tolerance.
      const size_t loads = static_cast<size_t>(cfg.n_layer * cfg.experts);
      std::vector<double> want(kRouterTotals), got(kRouterTotals), want_load(loads), got_load(loads);
      ref.take_router_stats(want.data(), want_load.data());
      gpu.take_router_stats(got.data(), got_load.data());
      MPI_Allreduce(MPI_IN_PLACE, got.data(), kRouterTotals, MPI_DOUBLE, MPI_SUM, staged_dup);
      MPI_Allreduce(MPI_IN_PLACE, got_load.data(), static_cast<int>(loads), MPI_DOUBLE, MPI_SUM,
                    staged_dup);
      EXPECT_GT(want[kDropped], 0) << "the capacity drops nothing: the test would not see its order";
      EXPECT_EQ(got[kDropped], want[kDropped]);
      EXPECT_EQ(got_load, want_load);
      EXPECT_NEAR(got[kAuxSum], want[kAuxSum], 1e-5 * want[kAuxSum]);
      EXPECT_NEAR(got[kZSum], want[kZSum], 1e-5 * want[kZSum]);
    }
    std::vector<float> grads(static_cast<size_t>(gpu.param_storage()));
    cuda::Ops<float>::download(ctx, grads.data(), gpu.grads(), gpu.param_storage());
    MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(grads.size()), MPI_FLOAT, MPI_SUM, staged_dup);
    for (const auto& spec : gpu.table().specs()) {
      double largest = 0;
      for (int64_t i = 0; i < spec.numel(); ++i)
        largest = std::max(largest, std::abs(ref.grads()[spec.offset + i]));
      for (int64_t i = 0; i < spec.numel(); ++i) {
        const double got = grads[static_cast<size_t>(spec.offset + i)], want = ref.grads()[spec.offset + i];
        ASSERT_LE(std::abs(got - want), 1e-4 * largest + 1e-4 * std::abs(want))
            << spec.name << "[" << i << "]: " << got << " against " << want;
      }
    }
  }
  MPI_Comm_free(&staged_dup);
}

// A small GPT-2, and the Llama made of it (grouped-query heads, SwiGLU,
// untied embeddings).
GptConfig small_gpt2() {
  GptConfig g;
  g.n_layer = 2;
  g.n_head = 4;
  g.n_embd = 32;
  g.vocab_size = 100;
  return g;
}
GptConfig llama_of(GptConfig l) {
  l.family = ModelFamily::kLlama;
  l.n_kv_head = 2;
  l.ffn_hidden = 48;
  l.tie_embeddings = false;
  return l;
}

TEST(ContextRing, TheGpuStageAtCpMatchesOneRankInDouble) {
  check_stage(small_gpt2());
  check_stage(llama_of(small_gpt2()));
}

// A Mixture of Experts at cp ranks: each rank routes its two chunks, the
// group's counts decide what every expert keeps of a whole sequence (a
// capacity of half the even share, so that many assignments drop), and
// the aux loss is the whole sequence's. GPT-2's with a dense layer,
// Llama's all sparse, against one rank in double as above.
TEST(ContextRing, TheGpuMixtureOfExpertsAtCpMatchesOneRankInDouble) {
  GptConfig gpt2 = small_gpt2();
  gpt2.experts = 4;
  gpt2.top_k = 2;
  gpt2.moe_every = 2;
  gpt2.capacity_factor = 0.5;
  gpt2.router_z_loss = 0.01;
  check_stage(gpt2);
  GptConfig llama = llama_of(gpt2);
  llama.moe_every = 1;
  check_stage(llama);
}

}  // namespace
}  // namespace mpiformer::test
