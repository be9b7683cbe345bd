// [data] document_mask: a window holding several documents trains as if
// each were its own sequence. The reference is the same model run on each
// document alone, unmasked, as the start of its own window (followed by
// filler, which causal attention keeps from reaching it): every token's
// loss under the mask equals its loss there. In double both compute the
// same sums over the same keys, so 1e-12 relative; a key of another
// document leaking in, or a position not restarting, moves a loss by far
// more (1e-3 here). Then every parameter's gradient under the mask against
// finite differences (the wpe rows summed by position, the rotations and
// the masked attention's backward), for GPT-2 and Llama, under each
// recomputation.
#include <cstring>
#include <vector>

#include "model/gpt_stage.hpp"
#include "reference.hpp"
#include "stage_gradients.hpp"

namespace mpiformer::test {
namespace {

GptConfig config(bool llama) {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  c.seq_len = 12;
  c.vocab_size = 13;
  if (llama) {
    c.family = ModelFamily::kLlama;
    c.n_kv_head = 2;
    c.ffn_hidden = 12;
    c.tie_embeddings = false;
  }
  return c;
}

// Two windows of 12: documents [0, 5) and [5, 12); then [0, 3), [3, 4)
// (one token) and [4, 12).
const std::vector<std::vector<int>> kDocs = {{0, 5, 12}, {0, 3, 4, 12}};

std::vector<int32_t> positions_of(int64_t T) {
  std::vector<int32_t> pos;
  for (const auto& starts : kDocs)
    for (size_t d = 0; d + 1 < starts.size(); ++d)
      for (int t = starts[d]; t < starts[d + 1]; ++t) pos.push_back(t - starts[d]);
  EXPECT_EQ(static_cast<int64_t>(pos.size()), 2 * T);
  return pos;
}

std::vector<int32_t> random_ids(int64_t n, unsigned seed, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = static_cast<int32_t>((seed = seed * 1103515245u + 12345u) >> 16) % vocab;
  return ids;
}

TEST(DocumentMask, EachDocumentsLossesAreItsOwnSequences) {
  for (const bool llama : {false, true}) {
    const GptConfig cfg = config(llama);
    const int64_t T = cfg.seq_len, V = cfg.vocab_size;
    host::Context ctx;
    StageOptions masked_opt{2, 1};
    masked_opt.document_mask = true;
    HostGptStage<double> masked(ctx, cfg, partition_stage(cfg, 0, 1), masked_opt);
    HostGptStage<double> alone(ctx, cfg, partition_stage(cfg, 0, 1), 1, 1);
    randomise_parameters(masked, llama ? 900 : 800);
    std::memcpy(alone.params(), masked.params(), sizeof(double) * masked.param_storage());
    const auto tok = random_ids(2 * T, 5, V), tgt = random_ids(2 * T, 6, V);
    const auto pos = positions_of(T);
    masked.forward(0, tok.data(), tgt.data(), false, 0.0, 0, pos.data());
    const std::vector<double> got(masked.losses(0), masked.losses(0) + 2 * T);
    double moved = 0;  // how far the plain (unmasked) window is from it
    HostGptStage<double> plain(ctx, cfg, partition_stage(cfg, 0, 1), 2, 1);
    std::memcpy(plain.params(), masked.params(), sizeof(double) * masked.param_storage());
    plain.forward(0, tok.data(), tgt.data(), false, 0.0);
    for (int64_t i = 0; i < 2 * T; ++i) moved = std::max(moved, std::fabs(plain.losses(0)[i] - got[i]));
    for (size_t b = 0; b < kDocs.size(); ++b) {
      const auto& starts = kDocs[b];
      for (size_t d = 0; d + 1 < starts.size(); ++d) {
        const int64_t s = static_cast<int64_t>(b) * T + starts[d], n = starts[d + 1] - starts[d];
        std::vector<int32_t> t1(tok.begin() + s, tok.begin() + s + n), t2(tgt.begin() + s, tgt.begin() + s + n);
        t1.resize(static_cast<size_t>(T), 1);  // filler after the document
        t2.resize(static_cast<size_t>(T), 1);
        alone.forward(0, t1.data(), t2.data(), false, 0.0);
        for (int64_t i = 0; i < n; ++i)
          EXPECT_NEAR(got[static_cast<size_t>(s + i)], alone.losses(0)[i], 1e-12 * std::fabs(alone.losses(0)[i]))
              << (llama ? "llama" : "gpt2") << " window " << b << " document " << d << " token " << i;
      }
    }
    // The test can fail: without the mask the later documents' losses differ.
    EXPECT_GT(moved, 1e-3) << (llama ? "llama" : "gpt2");
    masked.take_loss_sum();
    alone.take_loss_sum();
    plain.take_loss_sum();
  }
}

// Without recomputation every parameter's gradient against central
// differences; recomputing attention or whole blocks redoes the same
// forward operations on the same values, so its gradients must be those,
// to double's rounding (1e-12 of the largest; a mask lost in the
// recomputed forward moves them by 1e-3 or more).
TEST(DocumentMask, EveryParameterGradientMatchesFiniteDifferences) {
  for (const bool llama : {false, true}) {
    const GptConfig cfg = config(llama);
    const int64_t T = cfg.seq_len;
    const auto tok = random_ids(2 * T, 7, cfg.vocab_size), tgt = random_ids(2 * T, 8, cfg.vocab_size);
    const auto pos = positions_of(T);
    const double scale = 1.0 / static_cast<double>(2 * T);
    std::vector<double> reference;
    for (const Recompute rc : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
      host::Context ctx;
      StageOptions opt{2, 1};
      opt.recompute = rc;
      opt.document_mask = true;
      HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), opt);
      randomise_parameters(stage, 700);
      const std::string label = std::string(llama ? ", llama" : ", gpt2") + ", recompute " + name_of(rc);
      if (rc == Recompute::kNone) {
        EXPECT_EQ(expect_gradients_match_finite_differences(stage, tok, tgt, scale, label, pos.data()),
                  stage.table().total_numel());
        reference = backward_gradients(stage, tok, tgt, scale, pos.data());
      } else {
        EXPECT_TRUE(close_to_largest(backward_gradients(stage, tok, tgt, scale, pos.data()),
                                     reference, 1e-12))
            << label;
      }
    }
  }
}

}  // namespace
}  // namespace mpiformer::test
