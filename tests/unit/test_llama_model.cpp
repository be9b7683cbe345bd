// The Llama-family stage against a forward written here from the model's
// definition with plain double loops (no kernel, no stage code): RMSNorm,
// q/k/v rows of the fused projection, rotary positions on pairs (i, i +
// hs/2) at theta^(-2i/hs), grouped-query causal attention, SwiGLU from the
// gate and up rows, the untied (or tied) head. Then every parameter's
// gradient against central finite differences of the stage's loss, under
// each recomputation (the backward of RMSNorm, RoPE, SwiGLU and grouped
// attention in place in the stage). In double, the forward agrees to 1e-7:
// the rotary table is float on every back end (host/rope.hpp), so its
// cos and sin carry float rounding (6e-8 relative), which reaches the
// logits as ~5e-9 here; a wrong base, pairing, position or kv head moves
// them by 1e-2 or more. The gradients: the tolerance of GPT-2's
// (test_model_gradients.cpp).
#include <cmath>
#include <cstring>
#include <map>

#include "model/gpt_stage.hpp"
#include "reference.hpp"
#include "stage_gradients.hpp"

namespace mpiformer::test {
namespace {

GptConfig llama_config(bool tied) {
  GptConfig c;
  c.family = ModelFamily::kLlama;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.ffn_hidden = 12;
  c.seq_len = 5;
  c.vocab_size = 11;
  c.rope_theta = 500.0;  // not the default: a wrong base shows
  c.norm_eps = 1e-5;
  c.tie_embeddings = tied;
  return c;
}


// The logits [B*T, vocab] of tokens [B, T] by the model's definition.
std::vector<double> naive_llama(const GptConfig& c, const HostGptStage<double>& stage,
                                const std::vector<int32_t>& tok, int64_t B) {
  const int64_t T = c.seq_len, C = c.n_embd, NH = c.n_head, NKV = c.n_kv_head, hs = C / NH;
  const int64_t K = NKV * hs, F = c.ffn_hidden, V = c.vocab_size;
  auto W = [&](const std::string& name) {
    return const_cast<HostGptStage<double>&>(stage).params() + stage.table().at(name).offset;
  };
  auto rms = [&](const std::vector<double>& x, const double* w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(C) + c.norm_eps);
    std::vector<double> y(C);
    for (int64_t i = 0; i < C; ++i) y[i] = x[i] * r * w[i];
    return y;
  };
  auto matvec = [](const double* w, const std::vector<double>& x, int64_t rows) {
    std::vector<double> y(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (size_t i = 0; i < x.size(); ++i) y[r] += w[r * x.size() + i] * x[i];
    return y;
  };
  auto rotate = [&](double* x, int64_t pos) {
    for (int64_t i = 0; i < hs / 2; ++i) {
      const double a = static_cast<double>(pos) * std::pow(c.rope_theta, -2.0 * i / hs);
      const double x1 = x[i], x2 = x[i + hs / 2];
      x[i] = x1 * std::cos(a) - x2 * std::sin(a);
      x[i + hs / 2] = x2 * std::cos(a) + x1 * std::sin(a);
    }
  };
  std::vector<double> logits(B * T * V);
  const double* wte = W("embed_tokens.weight");
  const double* head = c.tie_embeddings ? wte : W("lm_head.weight");
  for (int64_t b = 0; b < B; ++b) {
    std::vector<std::vector<double>> x(T, std::vector<double>(C));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < C; ++i) x[t][i] = wte[tok[b * T + t] * C + i];
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q(T), k(T), v(T);
      for (int64_t t = 0; t < T; ++t) {
        const auto y = matvec(W(h + "self_attn.qkv_proj.weight"), rms(x[t], W(h + "input_layernorm.weight")), C + 2 * K);
        q[t].assign(y.begin(), y.begin() + C);
        k[t].assign(y.begin() + C, y.begin() + C + K);
        v[t].assign(y.begin() + C + K, y.end());
        for (int64_t hh = 0; hh < NH; ++hh) rotate(q[t].data() + hh * hs, t);
        for (int64_t hh = 0; hh < NKV; ++hh) rotate(k[t].data() + hh * hs, t);
      }
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> att(C, 0.0);
        for (int64_t hh = 0; hh < NH; ++hh) {
          const int64_t kv = hh / (NH / NKV);
          std::vector<double> p(t + 1);
          double mx = -1e300, z = 0;
          for (int64_t j = 0; j <= t; ++j) {
            double d = 0;
            for (int64_t i = 0; i < hs; ++i) d += q[t][hh * hs + i] * k[j][kv * hs + i];
            p[j] = d / std::sqrt(static_cast<double>(hs));
            mx = std::max(mx, p[j]);
          }
          for (auto& e : p) z += (e = std::exp(e - mx));
          for (int64_t j = 0; j <= t; ++j)
            for (int64_t i = 0; i < hs; ++i) att[hh * hs + i] += p[j] / z * v[j][kv * hs + i];
        }
        const auto o = matvec(W(h + "self_attn.o_proj.weight"), att, C);
        for (int64_t i = 0; i < C; ++i) x[t][i] += o[i];
      }
      for (int64_t t = 0; t < T; ++t) {
        const auto gu = matvec(W(h + "mlp.gate_up_proj.weight"), rms(x[t], W(h + "post_attention_layernorm.weight")), 2 * F);
        std::vector<double> a(F);
        for (int64_t i = 0; i < F; ++i) a[i] = gu[i] / (1 + std::exp(-gu[i])) * gu[F + i];
        const auto d = matvec(W(h + "mlp.down_proj.weight"), a, C);
        for (int64_t i = 0; i < C; ++i) x[t][i] += d[i];
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      const auto y = matvec(head, rms(x[t], W("norm.weight")), V);
      std::copy(y.begin(), y.end(), logits.begin() + (b * T + t) * V);
    }
  }
  return logits;
}

const std::vector<int32_t> kTok = {1, 5, 10, 3, 0, 7, 7, 2, 9, 4};
const std::vector<int32_t> kTgt = {5, 10, 3, 9, 7, 7, 2, 4, 1, 6};

TEST(LlamaModel, ForwardMatchesTheModelsDefinition) {
  for (bool tied : {false, true}) {
    const GptConfig cfg = llama_config(tied);
    const int64_t B = 2, T = cfg.seq_len, V = cfg.vocab_size, Vp = cfg.padded_vocab();
    host::Context ctx;
    HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), B, 1);
    randomise_parameters(stage, 300);
    stage.forward(0, kTok.data(), kTgt.data(), false, 0.0);
    const auto want = naive_llama(cfg, stage, kTok, B);
    std::vector<double> got(B * T * V);
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t v = 0; v < V; ++v) got[r * V + v] = stage.logits(0)[r * Vp + v];
    EXPECT_TRUE(all_close(got, want, 1e-7, 1e-7)) << (tied ? "tied" : "untied");
  }
}

TEST(LlamaModel, EveryParameterGradientMatchesFiniteDifferences) {
  for (const Recompute rc : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
    const GptConfig cfg = llama_config(false);
    const int64_t B = 2, T = cfg.seq_len;
    host::Context ctx;
    StageOptions opt{B, 1};
    opt.recompute = rc;
    HostGptStage<double> stage(ctx, cfg, partition_stage(cfg, 0, 1), opt);
    randomise_parameters(stage, 400);
    const double scale = 1.0 / static_cast<double>(B * T);
    const int64_t checked = expect_gradients_match_finite_differences(
        stage, kTok, kTgt, scale, std::string(", recompute ") + name_of(rc));
    EXPECT_EQ(checked, stage.table().total_numel());
  }
}

}  // namespace
}  // namespace mpiformer::test
