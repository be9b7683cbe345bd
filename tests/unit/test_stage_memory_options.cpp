// The stage's memory options change where values live, never the values:
// recomputation (attention, full) gives bit-identical losses and gradients
// to keeping everything, and the ZeRO windows (weights and gradients of one
// block at a time, filled and drained by hooks) give bit-identical results
// to the flat buffers, and so does the backward split into B and W (the
// zero-bubble schedules: both B's before either W, so W reads only what
// the slot kept, never the shared scratch the other B rewrote; each
// forward followed by its B, as on zb-h1's last stage). Two
// micro-batches in flight, as 1F1B has them, and a stage without the
// embedding. stage_footprint stays exact for each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/gpt_stage.hpp"
#include "model/stage_footprint.hpp"
#include "reference.hpp"

namespace mpiformer::test {
namespace {

GptConfig config() {
  GptConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 16;
  c.seq_len = 8;
  c.vocab_size = 37;
  return c;
}

struct Outcome {
  double loss = 0;
  std::vector<float> grads;  // flat, table order
  std::vector<float> input_grad;
};

// Two micro-batches: forward 0, forward 1, backward 1, backward 0.
// `late`: the weights kept whole (no weight windows) start as NaN and the
// need_published hook writes each use's (a block, the embedding's, the
// final norm's and head's) as ZeRO's gathers after AdamW arrive: a forward
// that read any before its hook would give NaN.
Outcome run(const GptConfig& cfg, const StageRange& range, const StageOptions& opt,
            bool late = false) {
  host::Context ctx;
  GptStage<host::Ops<float>> stage(ctx, cfg, range, opt);
  const ParameterTable& table = stage.table();
  const int64_t n = table.total_storage(), BT = opt.micro_batch * cfg.seq_len;
  std::vector<float> weights(static_cast<size_t>(n));
  fill_initial_parameters(table, 7, weights.data());
  std::vector<float> grads(static_cast<size_t>(n), 0.0f);
  const StageLayout& at = stage.layout();
  // Block i's own span (a sparse block is larger than a dense one; the
  // windows hold the largest).
  const auto block = [&](int64_t i) { return at.block_stop(i) - at.layers[i][0]; };
  // What a window carries: block i's span, or (its weights at zero 3, its
  // gradients from zero 2) a piece of a vocabulary use's tensor
  // (StageLayout::piece_id of kVocabIn, kVocabOut).
  const auto span = [&](int64_t i) -> std::pair<int64_t, int64_t> {
    if (i >= 0) return {at.layers[i][0], block(i)};
    EXPECT_LE(at.piece(i).size(), at.block_storage()) << "a piece fits a window";
    return {at.piece(i).begin, at.piece(i).size()};
  };
  const bool vocab_weights = stage.vocab_weights_windowed();
  const bool vocab = stage.vocab_grads_windowed();
  EXPECT_EQ(vocab_weights, opt.window_weights) << "the vocabulary's weights in windows at zero 3";
  EXPECT_EQ(vocab, opt.window_weights || opt.window_vocab_grads) << "its gradients from zero 2";
  // Resident weights (outside the windows) at their compacted places.
  auto resident = [&](float* dst) {
    for (const auto& s : table.specs())
      if (s.layer < 0 && !(vocab_weights && at.is_vocab(s.offset)))
        std::memcpy(dst + stage.resident_weight_offset(s.offset), weights.data() + s.offset,
                    sizeof(float) * s.storage);
  };
  if (opt.external_master) {
    resident(stage.weights());
    if (!opt.window_weights) std::memcpy(stage.weights(), weights.data(), sizeof(float) * n);
  } else {
    std::memcpy(stage.params(), weights.data(), sizeof(float) * n);
    stage.refresh_weights();
  }
  BlockHooks hooks;
  if (late) {
    EXPECT_TRUE(opt.external_master && !opt.window_weights) << "late weights need them whole";
    std::fill(stage.weights(), stage.weights() + n, std::nanf(""));
    hooks.need_published = [&](int64_t id) {
      for (const auto& s : table.specs())
        if (at.use_of(s.offset) == id)
          std::memcpy(stage.weights() + s.offset, weights.data() + s.offset,
                      sizeof(float) * s.storage);
    };
  }
  hooks.need_weights = [&](int64_t i, int64_t) {
    const auto [begin, size] = span(i);
    std::memcpy(stage.weight_window(at.window_of(i)), weights.data() + begin, sizeof(float) * size);
  };
  hooks.need_grad_window = [](int64_t, int) {};
  hooks.grads_ready = [&](int64_t i, int window) {
    const auto [begin, size] = span(i);
    const float* w = stage.grad_window(window);
    for (int64_t k = 0; k < size; ++k) grads[begin + k] += w[k];
  };
  stage.set_hooks(hooks);
  stage.zero_grads();
  std::vector<int32_t> tok(BT), tgt(BT);
  for (int64_t i = 0; i < BT; ++i) {
    tok[i] = static_cast<int32_t>((i * 7 + 3) % cfg.vocab_size);
    tgt[i] = static_cast<int32_t>((i * 5 + 1) % cfg.vocab_size);
  }
  const auto input = random_vector(static_cast<size_t>(BT * cfg.n_embd), 3, 1.0);
  Outcome o;
  auto forward = [&](int slot) {
    if (!range.has_embedding)
      for (int64_t k = 0; k < BT * cfg.n_embd; ++k)
        stage.input_buffer(slot)[k] = static_cast<float>(input[k]) * (slot + 1);
    stage.forward(slot, tok.data(), tgt.data(), true, 0.01f);
  };
  auto backward = [&](int slot) {
    if (!range.has_head)
      for (int64_t k = 0; k < BT * cfg.n_embd; ++k)
        stage.output_grad_buffer()[k] = static_cast<float>(input[k]) * 0.5f;
    // Under split backward no gradient is final before W: a reducer
    // started from B would send them incomplete.
    int finals = 0;
    stage.backward(slot, [&](int64_t) { ++finals; });
    EXPECT_EQ(finals == 0, opt.split_backward);
    if (!range.has_embedding)
      o.input_grad.insert(o.input_grad.end(), stage.input_grad(), stage.input_grad() + BT * cfg.n_embd);
  };
  if (!opt.split_backward) {
    for (int slot : {0, 1}) forward(slot);
    for (int slot : {1, 0}) backward(slot);
  } else {
    // As zb-h1's last stage runs them (B right after its forward: the
    // head's buffers are shared), the gradients summed in the same order.
    for (int slot : {1, 0}) {
      forward(slot);
      backward(slot);
    }
  }
  if (opt.split_backward) {
    for (int slot = 1; slot >= 0; --slot) {
      int64_t last = -1;
      stage.weight_gradients(slot, [&](int64_t offset) { last = offset; });
      EXPECT_EQ(last, 0) << "W ends with every gradient final";
    }
  }
  o.loss = stage.take_loss_sum();
  // The resident gradients, back at their table offsets.
  for (const auto& s : table.specs()) {
    if ((s.layer >= 0 && opt.window_grads) || (vocab && at.is_vocab(s.offset))) continue;
    const float* g = stage.grads() + stage.resident_grad_offset(s.offset);
    for (int64_t k = 0; k < s.storage; ++k) grads[s.offset + k] += g[k];
  }
  o.grads = grads;
  EXPECT_EQ(static_cast<double>(stage.allocated_bytes()),
            stage_footprint(cfg, range, opt, sizeof(float), sizeof(float)).total());
  return o;
}

// `loose` (offset, count): a range compared to 1e-6 relative instead.
void expect_identical(const Outcome& a, const Outcome& b, const char* what,
                      std::pair<int64_t, int64_t> loose = {0, 0}) {
  EXPECT_EQ(a.loss, b.loss) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  const auto [lo, n] = loose;
  EXPECT_EQ(0, std::memcmp(a.grads.data(), b.grads.data(), sizeof(float) * lo)) << what;
  const size_t hi = static_cast<size_t>(lo + n);
  EXPECT_EQ(0, std::memcmp(a.grads.data() + hi, b.grads.data() + hi,
                           sizeof(float) * (a.grads.size() - hi)))
      << what;
  for (int64_t k = lo; k < lo + n; ++k)
    ASSERT_NEAR(a.grads[k], b.grads[k], 1e-6 * std::abs(a.grads[k]) + 1e-12) << what << " at " << k;
  EXPECT_EQ(a.input_grad, b.input_grad) << what;
}

// A Mixture of Experts over the same: layers 0 and 2 sparse (4 experts,
// top 2, some assignments dropped), layer 1 dense, so blocks differ in
// size (the windows hold the largest) and B keeps the experts' gradients
// for W.
GptConfig moe_config() {
  GptConfig c = config();
  c.experts = 4;
  c.top_k = 2;
  c.moe_every = 2;
  c.capacity_factor = 1.0;
  c.router_z_loss = 0.01;
  return c;
}

TEST(StageMemoryOptions, RecomputationAndWindowsChangeNoBit) {
  for (const GptConfig& cfg : {config(), moe_config()})
  for (int pp : {1, 2}) {
    for (int s = 0; s < pp; ++s) {
      const StageRange range = partition_stage(cfg, s, pp);
      StageOptions base{2, 2};
      const Outcome want = run(cfg, range, base);
      if (range.has_head) {
        ASSERT_NE(want.loss, 0.0);
      }
      double norm = 0;
      for (float g : want.grads) norm += g * g;
      ASSERT_GT(norm, 0.0);  // so equal gradients are not two sets of zeros
      for (Recompute r : {Recompute::kAttention, Recompute::kFull}) {
        StageOptions o = base;
        o.recompute = r;
        expect_identical(want, run(cfg, range, o), name_of(r));
      }
      StageOptions z2 = base;
      z2.external_master = z2.window_grads = z2.window_vocab_grads = true;
      expect_identical(want, run(cfg, range, z2), "gradient windows");
      expect_identical(want, run(cfg, range, z2, true), "weights published late");
      StageOptions z3 = z2;
      z3.window_weights = true;
      z3.recompute = Recompute::kFull;
      expect_identical(want, run(cfg, range, z3), "weight and gradient windows, full recompute");
      // Split, a stage with the head and the embedding (pp 1) adds their
      // two parts of the tied wte's gradient in another order (the
      // head's are B's, the embedding's W's): the last bits may differ.
      std::pair<int64_t, int64_t> wte = {0, 0};
      if (range.has_head && range.has_embedding) {
        const ParameterTable table(cfg, range);
        wte = {table.at("wte").offset, table.at("wte").storage};
      }
      for (Recompute r : {Recompute::kNone, Recompute::kAttention}) {
        StageOptions split = base;
        split.split_backward = true;
        split.recompute = r;
        expect_identical(want, run(cfg, range, split), "split backward", wte);
        StageOptions split3 = z3;
        split3.split_backward = true;
        split3.recompute = r;
        expect_identical(want, run(cfg, range, split3), "split backward, weight and gradient windows",
                         wte);
      }
    }
  }
}

// A vocabulary larger than a window goes through it in row pieces
// (StageLayout::piece): 300 tokens, padded to 384 rows of 16, against a
// block of 3280 floats: pieces of 200 rows (205 fit, cut to a multiple of
// 8) and 184. The embedding writes each row from the piece holding its
// token, and each piece's gradient rows are its own, so those are the
// bits of the whole tensor's. The head's logits are a product per piece
// and its input gradient adds the pieces' products in float: a sum over
// the vocabulary split in two, not one product, so the loss, the
// gradients and the stage's input gradient are compared to 1e-5 of their
// largest magnitude (fp32 sums of a few hundred terms reordered, carried
// through three blocks' backward).
void expect_close(const Outcome& a, const Outcome& b, const char* what) {
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(a.loss)) << what;
  for (const auto* v : {&a.grads, &a.input_grad}) {
    const auto* w = v == &a.grads ? &b.grads : &b.input_grad;
    ASSERT_EQ(v->size(), w->size()) << what;
    float most = 0;
    for (float x : *v) most = std::max(most, std::abs(x));
    for (size_t k = 0; k < v->size(); ++k)
      ASSERT_NEAR((*v)[k], (*w)[k], 1e-5 * most) << what << " at " << k;
  }
}

TEST(StageMemoryOptions, TheVocabularyInPiecesMatchesItWhole) {
  GptConfig cfg = config();
  cfg.vocab_size = 300;
  for (int pp : {1, 2}) {
    for (int s = 0; s < pp; ++s) {
      const StageRange range = partition_stage(cfg, s, pp);
      const ParameterTable table(cfg, range);
      const StageLayout at(table, range);
      ASSERT_EQ(at.block_storage(), 3280);
      for (const int64_t use : {StageLayout::kVocabIn, StageLayout::kVocabOut}) {
        if (at.vocab(use).begin < 0) continue;
        ASSERT_EQ(at.vocab_pieces(use), 2);
        EXPECT_EQ(at.piece(StageLayout::piece_id(use, 0)).rows, 200);
        EXPECT_EQ(at.piece(StageLayout::piece_id(use, 1)).rows, 184);
      }
      StageOptions base{2, 2};
      const Outcome want = run(cfg, range, base);
      // Zero 2: the gradients in pieces, the weights whole (the forward
      // in one piece).
      StageOptions z2 = base;
      z2.external_master = z2.window_grads = z2.window_vocab_grads = true;
      const Outcome grads = run(cfg, range, z2);
      expect_close(want, grads, "gradient windows");
      StageOptions z3 = z2;
      z3.window_weights = true;
      const Outcome got = run(cfg, range, z3);
      expect_close(want, got, "weight and gradient windows");
      // Without the head (pp 2's first stage) the pieces are the
      // embedding's alone: every bit as whole.
      if (!range.has_head) {
        expect_identical(want, grads, "the embedding's gradients in pieces");
        expect_identical(want, got, "the embedding in pieces");
      }
      StageOptions split3 = z3;
      split3.split_backward = true;
      expect_close(want, run(cfg, range, split3), "split backward, weight and gradient windows");
    }
  }
}

TEST(StageMemoryOptions, FootprintShrinksAsExpected) {
  GptConfig cfg = config();
  cfg.n_layer = 8;
  const StageRange all = partition_stage(cfg, 0, 1);
  const StageOptions none{4, 2};
  StageOptions attention = none, full = none;
  attention.recompute = Recompute::kAttention;
  full.recompute = Recompute::kFull;
  const double B = 4, T = cfg.seq_len, C = cfg.n_embd, NH = cfg.n_head, L = 8, slots = 2;
  const auto f0 = stage_footprint(cfg, all, none, 4, 4);
  const auto fa = stage_footprint(cfg, all, attention, 4, 4);
  const auto ff = stage_footprint(cfg, all, full, 4, 4);
  // attention: every kept T x T block but one shared.
  EXPECT_EQ(f0.total() - fa.total(), (L * slots - 1) * B * NH * T * T * 4);
  // full: per slot only the block inputs remain of the blocks' activations.
  EXPECT_EQ(f0.per_slot - ff.per_slot, L * (15 * B * T * C * 4 + 4 * B * T * 4 + B * NH * T * T * 4));
  // ZeRO windows: two blocks' gradients (weights) instead of all eight;
  // from zero 2 the tied wte (37 x 16, smaller than a block) goes through
  // them too, so its gradients do not stay (nor, at zero 3, its weights);
  // 16-bit gradients at zero 1 window the blocks' alone.
  StageOptions z2 = none, z3 = none, z1_16 = none;
  z1_16.external_master = z1_16.window_grads = true;
  z2 = z1_16;
  z2.window_vocab_grads = true;
  z3 = z2;
  z3.window_weights = true;
  const ParameterTable table(cfg, all);
  const StageLayout layout(table, all);
  const double block = static_cast<double>(layout.block_storage()) * 4;
  const double wte = static_cast<double>(table.at("wpe").offset - table.at("wte").offset) * 4;
  ASSERT_GE(wte, 37 * 16 * 4);
  EXPECT_EQ(stage_footprint(cfg, all, z1_16, 4, 4).gradients, f0.gradients - (L - 2) * block);
  EXPECT_EQ(stage_footprint(cfg, all, z2, 4, 4).gradients, f0.gradients - (L - 2) * block - wte);
  EXPECT_EQ(stage_footprint(cfg, all, z2, 4, 4).weight_copy, f0.parameters);
  EXPECT_EQ(stage_footprint(cfg, all, z3, 4, 4).gradients, f0.gradients - (L - 2) * block - wte);
  EXPECT_EQ(stage_footprint(cfg, all, z3, 4, 4).weight_copy, f0.parameters - (L - 2) * block - wte);
  EXPECT_EQ(stage_footprint(cfg, all, z3, 4, 4).parameters, 0.0);
}

}  // namespace
}  // namespace mpiformer::test
