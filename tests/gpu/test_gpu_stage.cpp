// GptStage on the CUDA op set against GptStage on the host op set in double,
// on the same model: the
// loss and every parameter gradient after two accumulated micro-mb,
// for the whole model on one stage and split over two stages chained by
// hand (activations forward, the input gradient back), and with the
// backward split into B and W (zb-h1), in fp32, bf16 and fp16; and the
// Llama family's whole model (RMSNorm, rotary positions, SwiGLU, 2 kv
// heads of 4, an untied head).
//
// Tolerances:
//  * fp32: loss 1e-5 relative; each gradient element within 1e-4 of the
//    tensor's largest |gradient| plus 1e-4 relative (float vs double through
//    two layers of sums of up to B*T*4C terms).
//  * bf16: loss 2e-2 relative, each gradient tensor within 5% in norm:
//    activations round to 8 significant bits at every op, so elementwise
//    bounds would only test the rounding's tails; a wrong kernel is off by
//    far more (a sign, a transpose or a missing term is O(1) in norm).
// Exits 77 without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/ops.hpp"
#include "model/gpt_stage.hpp"
#include "model/stage_footprint.hpp"

namespace mpiformer::test {
namespace {

GptConfig tiny_config() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.seq_len = 16;
  c.vocab_size = 100;
  return c;
}

constexpr int64_t kB = 2;

std::vector<int32_t> tokens(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(0, 99);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(gen);
  return t;
}

template <class A>
using CudaGptStage = GptStage<cuda::Ops<A>>;

template <class T>
std::vector<T> download(cuda::Context& ctx, const T* dev, int64_t n) {
  std::vector<T> h(n);
  cuda::Ops<float>::download(ctx, h.data(), dev, n);
  return h;
}

// kB sequences a micro-batch, `slots` in flight, documents masked apart or not.
StageOptions masked(bool document_mask, int slots = 1) {
  StageOptions o{kB, slots};
  o.document_mask = document_mask;
  return o;
}

// Documents packed in the kB windows of 16: [0, 5), [5, 6), [6, 16); then
// [0, 9), [9, 16).
std::vector<int32_t> document_positions() {
  const std::vector<std::vector<int>> starts = {{0, 5, 6, 16}, {0, 9, 16}};
  std::vector<int32_t> pos;
  for (const auto& w : starts)
    for (size_t d = 0; d + 1 < w.size(); ++d)
      for (int t = w[d]; t < w[d + 1]; ++t) pos.push_back(t - w[d]);
  return pos;
}

// The reference: the whole model in double on the host, from `params`.
struct Reference {
  double loss = 0;
  std::vector<double> grads;
  host::Context ctx;
  HostGptStage<double> stage;
  // `positions`: the document mask's, for every micro-batch (nullptr: none).
  Reference(const GptConfig& cfg, const std::vector<float>& params,
            const std::vector<std::vector<int32_t>>& in, const std::vector<std::vector<int32_t>>& tg,
            double scale, const int32_t* positions = nullptr)
      : stage(ctx, cfg, StageRange{0, cfg.n_layer, true, true}, masked(positions != nullptr)) {
    std::copy(params.begin(), params.end(), stage.params());
    stage.zero_grads();
    for (size_t m = 0; m < in.size(); ++m) {
      stage.forward(0, in[m].data(), tg[m].data(), true, scale, 0, positions);
      stage.backward(0);
    }
    loss = stage.take_loss_sum();
    grads.assign(stage.grads(), stage.grads() + stage.param_storage());
  }
};

// Compares the gradients of the tensors of `table` (a stage's) with the
// whole-model reference, by name.
template <class A>
void expect_grads(const ParameterTable& table, const std::vector<float>& got,
                  const ParameterTable& whole, const std::vector<double>& want) {
  for (const auto& s : table.specs()) {
    const auto& w = whole.at(s.name);
    double max_want = 0, diff2 = 0, want2 = 0;
    for (int64_t i = 0; i < s.numel(); ++i) max_want = std::max(max_want, std::fabs(want[w.offset + i]));
    int bad = 0;
    for (int64_t i = 0; i < s.numel(); ++i) {
      const double g = got[s.offset + i], r = want[w.offset + i];
      diff2 += (g - r) * (g - r);
      want2 += r * r;
      if (std::is_same_v<A, float> && !(std::fabs(g - r) <= 1e-4 * max_want + 1e-4 * std::fabs(r))) {
        if (bad++ == 0) ADD_FAILURE() << s.name << "[" << i << "]: got " << g << ", want " << r;
      }
    }
    if (!std::is_same_v<A, float>) {
      EXPECT_LE(std::sqrt(diff2), 0.05 * std::sqrt(want2) + 1e-12) << s.name;
    }
    // Padding (wte's rows past the vocabulary) gets no gradient at all.
    for (int64_t i = s.numel(); i < s.storage; ++i) EXPECT_EQ(got[s.offset + i], 0.f) << s.name;
  }
}

// Two micro-mb of the tiny model: inputs and targets drawn from
// seeds `seed` .. `seed + 3`, and the loss scale of their mean.
GptConfig llama_tiny_config() {
  GptConfig c = tiny_config();
  c.family = ModelFamily::kLlama;
  c.n_kv_head = 2;
  c.ffn_hidden = 48;
  c.tie_embeddings = false;
  return c;
}

struct TwoMicroBatches {
  GptConfig cfg = tiny_config();
  int64_t BT = kB * cfg.seq_len;
  float scale = 1.f / static_cast<float>(2 * BT);
  std::vector<std::vector<int32_t>> in, tg;
  explicit TwoMicroBatches(unsigned seed, const GptConfig& c = tiny_config())
      : cfg(c),
        in{tokens(BT, seed), tokens(BT, seed + 1)},
        tg{tokens(BT, seed + 2), tokens(BT, seed + 3)} {}
};

template <class A>
class GpuStage : public ::testing::Test {};
using Types = ::testing::Types<float, cuda::bf16, cuda::fp16>;
TYPED_TEST_SUITE(GpuStage, Types);

// `documents`: with the document mask (the same positions for both
// micro-batches), against the host's masked stage.
template <class A>
void check_whole_model(const GptConfig& config, bool documents = false) {
  const TwoMicroBatches mb(1, config);
  const GptConfig& cfg = mb.cfg;
  cuda::Context ctx(0);
  CudaGptStage<A> gpu(ctx, cfg, StageRange{0, cfg.n_layer, true, true}, masked(documents, 2));
  // The accounting counts what the GPU stage allocates, attention's row
  // statistics (not the host's probabilities) included.
  if (!documents) {
    EXPECT_EQ(static_cast<double>(gpu.allocated_bytes()),
              stage_footprint(cfg, StageRange{0, cfg.n_layer, true, true}, kB, 2, sizeof(A),
                              sizeof(float), AttentionStorage::kRowStatistics)
                  .total());
  }
  gpu.init_parameters(7);
  const auto params = download(ctx, gpu.params(), gpu.param_storage());
  const std::vector<int32_t> pos = document_positions();
  const int32_t* positions = documents ? pos.data() : nullptr;
  const Reference ref(cfg, params, mb.in, mb.tg, mb.scale, positions);

  gpu.zero_grads();
  for (int m = 0; m < 2; ++m)
    gpu.forward(m, mb.in[m].data(), mb.tg[m].data(), true, mb.scale, 0, positions);
  for (int m = 1; m >= 0; --m) gpu.backward(m);  // slots keep each micro-batch
  const double loss = gpu.take_loss_sum();
  EXPECT_NEAR(loss, ref.loss, (std::is_same_v<A, float> ? 1e-5 : 2e-2) * ref.loss);
  expect_grads<A>(gpu.table(), download(ctx, gpu.grads(), gpu.param_storage()), ref.stage.table(),
                  ref.grads);
}

TYPED_TEST(GpuStage, WholeModelMatchesHostDouble) { check_whole_model<TypeParam>(tiny_config()); }

TYPED_TEST(GpuStage, LlamaWholeModelMatchesHostDouble) {
  check_whole_model<TypeParam>(llama_tiny_config());
}

// [data] document_mask: positions restart (wpe's rows, RoPE's angles) and
// attention stays inside each document, on the device as on the host.
TYPED_TEST(GpuStage, DocumentMaskMatchesHostDouble) {
  check_whole_model<TypeParam>(tiny_config(), true);
  check_whole_model<TypeParam>(llama_tiny_config(), true);
}

// A Mixture of Experts (4 experts, top 2, some assignments dropped; GPT-2's
// with a dense layer, Llama's all sparse): the router's decisions, the
// dispatch, each expert's GEMMs on its rows and the combine on the device
// against the host in double. fp32 only: in bf16 and fp16 the router's
// logits carry the activation type's rounding (2^-8 relative), which
// routes a few of the 64 tokens' near ties otherwise than double does, so
// those experts' gradients differ by design, not by a fault. The kernels'
// low-precision instances are checked alone (GpuKernels.MoeDispatchAndCombine).
TEST(GpuStageMoe, WholeModelMatchesHostDouble) {
  GptConfig g = tiny_config();
  g.experts = 4;
  g.top_k = 2;
  g.moe_every = 2;
  g.capacity_factor = 1.0;
  g.router_z_loss = 0.01;
  check_whole_model<float>(g);
  GptConfig l = llama_tiny_config();
  l.experts = 4;
  l.top_k = 2;
  l.capacity_factor = 1.0;
  check_whole_model<float>(l);
}

// The zero-bubble schedules' split backward on the device: both B's before
// either W (W reads only what its slot kept), each forward followed by its
// B (the head's buffers are shared), attention recomputed in one case.
TYPED_TEST(GpuStage, SplitBackwardMatchesHostDouble) {
  using A = TypeParam;
  const TwoMicroBatches mb(11);
  const GptConfig& cfg = mb.cfg;
  const StageRange all{0, cfg.n_layer, true, true};
  for (const Recompute r : {Recompute::kNone, Recompute::kAttention}) {
    SCOPED_TRACE(name_of(r));
    StageOptions o{kB, 2};
    o.recompute = r;
    o.split_backward = true;
    cuda::Context ctx(0);
    CudaGptStage<A> gpu(ctx, cfg, all, o);
    EXPECT_EQ(static_cast<double>(gpu.allocated_bytes()),
              stage_footprint(cfg, all, o, sizeof(A), sizeof(float),
                              AttentionStorage::kRowStatistics)
                  .total());
    gpu.init_parameters(7);
    const auto params = download(ctx, gpu.params(), gpu.param_storage());
    const Reference ref(cfg, params, mb.in, mb.tg, mb.scale);
    gpu.zero_grads();
    int finals = 0;
    for (int m = 1; m >= 0; --m) {
      gpu.forward(m, mb.in[m].data(), mb.tg[m].data(), true, mb.scale);
      gpu.backward(m, [&](int64_t) { ++finals; });
    }
    EXPECT_EQ(finals, 0) << "B finishes no gradient";
    for (int m = 1; m >= 0; --m) gpu.weight_gradients(m);
    EXPECT_NEAR(gpu.take_loss_sum(), ref.loss, (std::is_same_v<A, float> ? 1e-5 : 2e-2) * ref.loss);
    expect_grads<A>(gpu.table(), download(ctx, gpu.grads(), gpu.param_storage()),
                    ref.stage.table(), ref.grads);
  }
}

// The whole model's parameters from its two stages' (wte from the first).
template <class A>
std::vector<float> whole_parameters(cuda::Context& ctx, const GptConfig& cfg, CudaGptStage<A>& first,
                                    CudaGptStage<A>& last) {
  const ParameterTable whole(cfg, StageRange{0, cfg.n_layer, true, true});
  std::vector<float> params(whole.total_storage());
  for (auto* st : {&last, &first}) {
    const auto p = download(ctx, st->params(), st->param_storage());
    for (const auto& s : st->table().specs())
      std::copy_n(p.begin() + s.offset, s.storage, params.begin() + whole.at(s.name).offset);
  }
  return params;
}

// Both stages initialised alike, their gradients zeroed, and the whole
// model's reference on `mb` from their parameters.
template <class A>
Reference start_pipeline(cuda::Context& ctx, const TwoMicroBatches& mb, CudaGptStage<A>& first,
                         CudaGptStage<A>& last) {
  first.init_parameters(9);
  last.init_parameters(9);
  first.zero_grads();
  last.zero_grads();
  return Reference(mb.cfg, whole_parameters(ctx, mb.cfg, first, last), mb.in, mb.tg, mb.scale);
}

// Both stages' gradients against the whole model's. Each stage's copy of
// wte gets only its own half of the tied gradient: their sum is compared,
// which is what the trainer's all-reduce makes.
template <class A>
void expect_pipeline_grads(cuda::Context& ctx, CudaGptStage<A>& first, CudaGptStage<A>& last,
                           const Reference& ref) {
  auto g1 = download(ctx, first.grads(), first.param_storage());
  auto g2 = download(ctx, last.grads(), last.param_storage());
  const auto& w1 = first.table().at("wte");
  const auto& w2 = last.table().at("wte");
  for (int64_t i = 0; i < w1.storage; ++i) g1[w1.offset + i] += g2[w2.offset + i];
  for (int64_t i = 0; i < w2.storage; ++i) g2[w2.offset + i] = g1[w1.offset + i];
  expect_grads<A>(first.table(), g1, ref.stage.table(), ref.grads);
  expect_grads<A>(last.table(), g2, ref.stage.table(), ref.grads);
}

TYPED_TEST(GpuStage, TwoStagesChainedMatchHostDouble) {
  using A = TypeParam;
  const TwoMicroBatches mb(5);
  const GptConfig& cfg = mb.cfg;
  const int64_t BT = mb.BT, C = cfg.n_embd;
  // Both stages on one context (one stream): the copies between them are
  // ordered with their kernels.
  cuda::Context ctx(0);
  CudaGptStage<A> first(ctx, cfg, partition_stage(cfg, 0, 2), kB, 1);
  CudaGptStage<A> last(ctx, cfg, partition_stage(cfg, 1, 2), kB, 1);
  const Reference ref = start_pipeline(ctx, mb, first, last);
  for (int m = 0; m < 2; ++m) {
    first.forward(0, mb.in[m].data(), nullptr, false, 0.f);
    cuda::Ops<A>::copy(ctx, last.input_buffer(0), first.output(0), BT * C);
    last.forward(0, nullptr, mb.tg[m].data(), true, mb.scale);
    last.backward(0);
    cuda::Ops<A>::copy(ctx, first.output_grad_buffer(), last.input_grad(), BT * C);
    first.backward(0);
  }
  EXPECT_NEAR(last.take_loss_sum(), ref.loss, (std::is_same_v<A, float> ? 1e-5 : 2e-2) * ref.loss);
  EXPECT_EQ(first.take_loss_sum(), 0.0);
  expect_pipeline_grads(ctx, first, last, ref);
}

// Interleaving with chunks of unequal length on the device: 6 layers into
// 2 x 2 chunks (stage 0: [0, 1) and [3, 5); stage 1: [1, 3) and [5, 6)),
// a slot per chunk, each micro-batch through the model's chunks in order
// and back, against the whole model in double on the host. Each stage
// allocates what stage_footprint says.
TYPED_TEST(GpuStage, UnevenInterleavedChunksMatchHostDouble) {
  using A = TypeParam;
  GptConfig six = tiny_config();
  six.n_layer = 6;
  const TwoMicroBatches mb(13, six);
  const GptConfig& cfg = mb.cfg;
  const int64_t BT = mb.BT, C = cfg.n_embd;
  cuda::Context ctx(0);
  const StageRange r0 = partition_stage(cfg, 0, 2, 1, 0, 2), r1 = partition_stage(cfg, 1, 2, 1, 0, 2);
  ASSERT_EQ(r0.chunk_layers(0), 1);
  ASSERT_EQ(r1.chunk_layers(1), 1);
  CudaGptStage<A> first(ctx, cfg, r0, kB, 2);
  CudaGptStage<A> last(ctx, cfg, r1, kB, 2);
  for (const auto* st : {&first, &last})
    EXPECT_EQ(static_cast<double>(st->allocated_bytes()),
              stage_footprint(cfg, st->range(), kB, 2, sizeof(A), sizeof(float),
                              AttentionStorage::kRowStatistics)
                  .total());
  const Reference ref = start_pipeline(ctx, mb, first, last);
  for (int m = 0; m < 2; ++m) {
    // Forward: stage 0 chunk 0, stage 1 chunk 0, stage 0 chunk 1, stage 1
    // chunk 1 (the head); chunk c in slot c.
    first.forward(0, mb.in[m].data(), nullptr, false, 0.f, 0);
    cuda::Ops<A>::copy(ctx, last.input_buffer(0), first.output(0), BT * C);
    last.forward(0, nullptr, nullptr, false, 0.f, 0);
    cuda::Ops<A>::copy(ctx, first.input_buffer(1), last.output(0), BT * C);
    first.forward(1, nullptr, nullptr, false, 0.f, 1);
    cuda::Ops<A>::copy(ctx, last.input_buffer(1), first.output(1), BT * C);
    last.forward(1, nullptr, mb.tg[m].data(), true, mb.scale, 1);
    // Backward, the other way.
    last.backward(1, nullptr, 1);
    cuda::Ops<A>::copy(ctx, first.output_grad_buffer(), last.input_grad(), BT * C);
    first.backward(1, nullptr, 1);
    cuda::Ops<A>::copy(ctx, last.output_grad_buffer(), first.input_grad(), BT * C);
    last.backward(0, nullptr, 0);
    cuda::Ops<A>::copy(ctx, first.output_grad_buffer(), last.input_grad(), BT * C);
    first.backward(0, nullptr, 0);
  }
  EXPECT_NEAR(last.take_loss_sum(), ref.loss, (std::is_same_v<A, float> ? 1e-5 : 2e-2) * ref.loss);
  EXPECT_EQ(first.take_loss_sum(), 0.0);
  expect_pipeline_grads(ctx, first, last, ref);
}

}  // namespace
}  // namespace mpiformer::test

