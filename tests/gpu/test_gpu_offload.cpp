// The optimizer's state offloaded from a GPU (train/adamw_state.hpp on the
// CUDA op set): the moments (and in bf16 the float masters) in host memory
// or in files, updated on the host block by block, the gradients copied
// down and the 16-bit copy (fp32: the masters) copied up. Against the
// device's own AdamW with everything resident: every bit of the masters,
// the moments and the 16-bit copy the matmuls read, over three steps, with
// small blocks that cut AdamW's chunks; and with the gradients copied to
// the host bucket by bucket before the step, a range changed after. And
// ZeRO 2-3 with the shard's gradients in host memory
// (train/zero_shards.hpp) against the same shards on the device: every bit
// of the masters after two steps of two micro-batches. Exits 77 without a
// GPU (its CPU emulation runs it everywhere).
#include <gtest/gtest.h>

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cuda/ops.hpp"
#include "model/stage_options.hpp"
#include "parallel/compute_ordered.hpp"
#include "parallel/local_device_communicator.hpp"
#include "train/adamw_state.hpp"
#include "train/zero_shards.hpp"

namespace mpiformer::test {
namespace {

template <class A>
struct Result {
  std::vector<float> p, m, v;
  std::vector<A> copy;
};

std::vector<float> random_floats(int64_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& e : x) e = d(gen);
  return x;
}

// `prefetch`: the gradients come down bucket by bucket before the step
// (as backward's reductions finish, from the end of the buffer), then a
// range changes on the device (a tied embedding's sum) and is said so.
template <class A>
// `gshift`: where the gradients start (AdamWChunk::grad_offset).
Result<A> three_steps(const OffloadSetup& where, bool prefetch = false, int64_t gshift = 77) {
  using Ops = cuda::Ops<A>;
  const int64_t n1 = kAdamWChunkElements + 3001, gap = 500, n2 = 2000, n = n1 + gap + n2;
  // fp32: the masters elsewhere than the moments (fp32 ZeRO's are the
  // stage's weights, at other offsets), copied down and up run by run.
  const int64_t shift = std::is_same_v<A, float> ? 333 : 0, np = n + shift;
  // The gradients and the 16-bit copy at offsets of their own too (ZeRO 1
  // keeps them in the stage's whole buffers); a prefetch needs the
  // gradients in the state's order (gshift 0).
  const int64_t cshift = std::is_same_v<A, float> ? 0 : 55;
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, AdamWPlaces{0, shift, gshift, cshift}, n1, true);
  append_adamw_chunks(chunks,
                      AdamWPlaces{n1 + gap, n1 + gap + shift, n1 + gap + gshift, n1 + gap + cshift},
                      n2, false);
  cuda::Context ctx(0);
  AdamWState<Ops> state(ctx, n, chunks, where);
  if (prefetch) state.enable_gradient_prefetch();
  cuda::DeviceBuffer<float> p(static_cast<size_t>(np)), g(static_cast<size_t>(n + gshift));
  cuda::DeviceBuffer<A> copy(static_cast<size_t>(n + cshift));
  // The gap is padding, as in a stage: zero, never updated.
  auto p0 = random_floats(np, 1, 1.0f);
  std::fill(p0.begin() + shift + n1, p0.begin() + shift + n1 + gap, 0.0f);
  // Mixed precision offloaded: the masters are the state's (host memory
  // or a file), and the 16-bit copy is all the device holds.
  if (state.holds_masters()) {
    state.load(p0.data(), nullptr, nullptr);
    // write_weights writes the listed elements only: the gap stays the
    // zeros a stage's buffers start with.
    Ops::fill_zero(ctx, copy.get(), n + cshift);
    state.write_weights(copy.get());
  } else {
    Ops::upload(ctx, p.get(), p0.data(), np);
    Ops::fill_zero(ctx, copy.get(), n + cshift);
    if constexpr (!std::is_same_v<A, float>) Ops::convert(ctx, copy.get() + cshift, p.get(), n);
  }
  for (int step = 1; step <= 3; ++step) {
    auto gs = random_floats(n + gshift, 10 + step, 0.1f);
    const int64_t changed = n1 / 3, changed_n = 777;
    const auto late = random_floats(changed_n, 20 + step, 0.1f);
    if (prefetch) {
      state.prefetch_begin();
      Ops::upload(ctx, g.get(), gs.data(), n);
      // The reduction as a one-rank communicator's: queued on the compute
      // stream, behind the upload, so each bucket's copy down waits for
      // it (a pageable upload returns before the device has the bytes).
      ComputeOrdered done(ctx.stream());
      for (int64_t end = n; end > 0; end -= 1000)
        state.prefetch_gradients(g.get(), std::max<int64_t>(0, end - 1000), end, done);
      Ops::upload(ctx, g.get() + changed, late.data(), changed_n);
      state.gradients_changed(changed, changed_n);
    } else {
      std::copy(late.begin(), late.end(), gs.begin() + changed);
      Ops::upload(ctx, g.get(), gs.data(), n + gshift);
    }
    state.step(p.get(), g.get(), AdamWParams{1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.7},
               std::is_same_v<A, float> ? nullptr : copy.get());
  }
  Result<A> r;
  r.p.resize(static_cast<size_t>(np));
  r.copy.resize(static_cast<size_t>(n + cshift));
  if (state.holds_masters()) std::memcpy(r.p.data(), state.master(), sizeof(float) * r.p.size());
  else Ops::download(ctx, r.p.data(), p.get(), np);
  if constexpr (!std::is_same_v<A, float>) Ops::download(ctx, r.copy.data(), copy.get(), n + cshift);
  for (int k = 0; k < 2; ++k) {
    auto& out = k == 0 ? r.m : r.v;
    out.resize(static_cast<size_t>(n));
    if (state.in_host_memory() && where.where != Offload::kNone) {
      std::memcpy(out.data(), state.moment(k), sizeof(float) * out.size());
    } else {
      Ops::download(ctx, out.data(), state.moment(k), n);
    }
  }
  state.release_views();
  return r;
}

template <class A>
void expect_same(const Result<A>& got, const Result<A>& want, const char* what) {
  EXPECT_EQ(0, std::memcmp(got.p.data(), want.p.data(), 4 * want.p.size())) << what;
  EXPECT_EQ(0, std::memcmp(got.m.data(), want.m.data(), 4 * want.m.size())) << what;
  EXPECT_EQ(0, std::memcmp(got.v.data(), want.v.data(), 4 * want.v.size())) << what;
  EXPECT_EQ(0, std::memcmp(got.copy.data(), want.copy.data(), sizeof(A) * want.copy.size())) << what;
}

template <class A>
void check_placements() {
  const Result<A> want = three_steps<A>(OffloadSetup{});
  std::string dir = (std::filesystem::temp_directory_path() / "mpiformer-gpu-offload-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  for (const Offload where : {Offload::kHost, Offload::kNvme}) {
    // 4096-element blocks: chunks of 16384 cut in four and more.
    expect_same(three_steps<A>(OffloadSetup{where, dir, 0, 1, 4096}), want, name_of(where));
  }
  // The gradients copied during backward, a range changed after.
  expect_same(three_steps<A>(OffloadSetup{Offload::kHost, dir, 0, 1, 4096}, true, 0),
              three_steps<A>(OffloadSetup{}, false, 0), "host, gradients prefetched");
  std::filesystem::remove_all(dir);
  // The update did something (the last tensor's last element).
  const auto p0 = random_floats(static_cast<int64_t>(want.p.size()), 1, 1.0f);
  EXPECT_NE(want.p.back(), p0.back());
}

TEST(GpuOffload, MomentsAnywhereGiveTheSameBitsFp32) { check_placements<float>(); }
TEST(GpuOffload, MomentsAnywhereGiveTheSameBitsBf16) { check_placements<cuda::bf16>(); }

// ZeRO 2-3 on a group of one (the windows, the block receive buffers and
// the units outside the blocks go the same way as on many ranks), the
// optimizer offloaded or not: the losses, the masters after each step and
// the gradient norm's sum of squares.
struct ZeroRun {
  std::vector<double> losses, squares;
  std::vector<float> masters;
};

template <class A>
ZeroRun zero_steps(int zero, Offload where, GradDtype grads = GradDtype::kFp32) {
  using Ops = cuda::Ops<A>;
  GptConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.seq_len = 8;
  // 300 tokens, padded to 384 rows of 16, against a block of 3280 floats:
  // the vocabulary goes through the windows in two pieces (its gradients
  // from zero 2, and at zero 1 with 16-bit gradients; its weights at
  // zero 3).
  cfg.vocab_size = 300;
  constexpr int64_t kB = 2;
  const int64_t BT = kB * cfg.seq_len;
  std::mt19937 gen(3);
  std::uniform_int_distribution<int32_t> tok(0, 299);
  std::vector<std::vector<int32_t>> in(2, std::vector<int32_t>(BT)), tg(in);
  for (int m = 0; m < 2; ++m)
    for (int64_t i = 0; i < BT; ++i) in[m][i] = tok(gen), tg[m][i] = tok(gen);
  cuda::Context ctx(0);
  StageOptions options = stage_options(kB, SlotKinds::any(2), Recompute::kNone, zero);
  if (grads == GradDtype::kBf16) options.window_grads = options.window_vocab_grads = true;
  GptStage<Ops> stage(ctx, cfg, StageRange{0, cfg.n_layer, true, true}, options);
  OffloadSetup setup;
  setup.where = where;
  setup.block_elements = 4096;
  ZeroShards<Ops> shards(stage, zero, 1, 0, setup, grads);
  LocalDeviceCommunicator comm(ctx.stream());
  shards.connect(comm, nullptr);
  shards.init(7);
  ZeroRun r;
  for (int step = 1; step <= 2; ++step) {
    shards.zero_grads();
    for (int m = 0; m < 2; ++m) stage.forward(m, in[m].data(), tg[m].data(), true, 1.f / (2 * BT));
    for (int m = 1; m >= 0; --m) shards.backward(m, m == 0, 0);
    r.losses.push_back(stage.take_loss_sum());
    shards.finish(nullptr);
    r.squares.push_back(shards.grad_sum_of_squares(false, false));
    shards.adamw(AdamWParams{1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.7});
  }
  r.masters.resize(static_cast<size_t>(shards.state_size()));
  if (shards.moments().holds_masters()) {
    std::memcpy(r.masters.data(), shards.master(), sizeof(float) * r.masters.size());
  } else {
    Ops::download(ctx, r.masters.data(), shards.master(), shards.state_size());
  }
  shards.moments().release_views();
  return r;
}

template <class A>
void check_zero_gradients_offloaded() {
  for (const int zero : {2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const ZeroRun want = zero_steps<A>(zero, Offload::kNone);
    const ZeroRun got = zero_steps<A>(zero, Offload::kHost);
    EXPECT_EQ(got.losses, want.losses);
    ASSERT_EQ(got.masters.size(), want.masters.size());
    EXPECT_EQ(0, std::memcmp(got.masters.data(), want.masters.data(), 4 * want.masters.size()));
    // The host's double sum against the device's: another order.
    for (size_t i = 0; i < want.squares.size(); ++i)
      EXPECT_NEAR(got.squares[i], want.squares[i], 1e-9 * want.squares[i]);
    EXPECT_NE(want.losses[0], want.losses[1]) << "the step changed nothing";
  }
}

TEST(GpuOffload, ZeroShardGradientsOnTheHostGiveTheSameBitsFp32) {
  check_zero_gradients_offloaded<float>();
}
TEST(GpuOffload, ZeroShardGradientsOnTheHostGiveTheSameBitsBf16) {
  check_zero_gradients_offloaded<cuda::bf16>();
}

// [train] grad_dtype = bf16 on the device: at zero 1 the blocks' 16-bit sums
// reduced in place and read by AdamW in 16 bits give the same bits as the
// offloaded form, which widens them into a float shard for the host's
// update; at zero 1-3, two micro-batches a step, the losses and norms stay
// within bf16's rounding of float gradients' (2e-3 and 2e-2 relative: the
// second step's loss moves by the first update's rounding, the norm by
// each block gradient's, 2^-9 a value) and the update changes them.
TEST(GpuOffload, SixteenBitGradientsOnTheDevice) {
  const ZeroRun in_place = zero_steps<cuda::bf16>(1, Offload::kNone, GradDtype::kBf16);
  const ZeroRun widened = zero_steps<cuda::bf16>(1, Offload::kHost, GradDtype::kBf16);
  EXPECT_EQ(in_place.losses, widened.losses);
  ASSERT_EQ(in_place.masters.size(), widened.masters.size());
  EXPECT_EQ(0, std::memcmp(in_place.masters.data(), widened.masters.data(), 4 * widened.masters.size()));
  for (const int zero : {1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const ZeroRun want = zero_steps<cuda::bf16>(zero, Offload::kNone);
    const ZeroRun got = zero_steps<cuda::bf16>(zero, Offload::kNone, GradDtype::kBf16);
    ASSERT_EQ(got.losses.size(), want.losses.size());
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], want.losses[i], 2e-3 * std::fabs(want.losses[i]));
      EXPECT_NEAR(got.squares[i], want.squares[i], 2e-2 * want.squares[i]);
    }
    EXPECT_NE(got.losses[0], got.losses[1]) << "the step changed nothing";
  }
}

}  // namespace
}  // namespace mpiformer::test
