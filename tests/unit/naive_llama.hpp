// Test support: the Llama family's logits written from the model's
// definition with plain double loops (no kernel, no stage code), a sparse
// MLP (Mixture of Experts) included. Shared by the Llama and MoE model
// tests.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "model/gpt_stage.hpp"
#include "moe_reference.hpp"

namespace mpiformer::test {

// The logits [B*T, vocab] of tokens [B, T] by the model's definition.
// A Mixture of Experts' sparse layers route each sequence by
// moe_reference.hpp's router; `routed` (if given) sums its aux and z losses.
inline std::vector<double> naive_llama(const GptConfig& c, const HostGptStage<double>& stage,
                                       const std::vector<int32_t>& tok, int64_t B,
                                       Naive* routed = nullptr) {
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
      // SwiGLU from the gate and up rows of `gate_up`, down to C channels.
      auto swiglu_mlp = [&](const std::string& mlp, const std::vector<double>& xn) {
        const auto gu = matvec(W(mlp + "gate_up_proj.weight"), xn, 2 * F);
        std::vector<double> a(F);
        for (int64_t i = 0; i < F; ++i) a[i] = gu[i] / (1 + std::exp(-gu[i])) * gu[F + i];
        return matvec(W(mlp + "down_proj.weight"), a, C);
      };
      std::vector<std::vector<double>> xn(T);
      for (int64_t t = 0; t < T; ++t) xn[t] = rms(x[t], W(h + "post_attention_layernorm.weight"));
      if (!c.moe_layer(l)) {
        for (int64_t t = 0; t < T; ++t) {
          const auto d = swiglu_mlp(h + "mlp.", xn[t]);
          for (int64_t i = 0; i < C; ++i) x[t][i] += d[i];
        }
        continue;
      }
      // A sparse MLP: the sequence routed as a whole (capacity is per
      // sequence), each token's kept experts' outputs weighed by its gates.
      const int64_t E = c.experts;
      std::vector<double> lg;
      for (int64_t t = 0; t < T; ++t) {
        const auto r = matvec(W(h + "mlp.router.weight"), xn[t], E);
        lg.insert(lg.end(), r.begin(), r.end());
      }
      const Naive route = naive_route(lg, T, T, E, c.top_k, c.expert_capacity(T));
      if (routed != nullptr) {
        routed->aux += route.aux;
        routed->z += route.z;
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < c.top_k; ++j) {
          if (route.dropped[t][j]) continue;
          const std::string mlp = h + "mlp.experts." + std::to_string(route.chosen[t][j]) + ".";
          const auto d = swiglu_mlp(mlp, xn[t]);
          for (int64_t i = 0; i < C; ++i) x[t][i] += route.gate[t][j] * d[i];
        }
    }
    for (int64_t t = 0; t < T; ++t) {
      const auto y = matvec(head, rms(x[t], W("norm.weight")), V);
      std::copy(y.begin(), y.end(), logits.begin() + (b * T + t) * V);
    }
  }
  return logits;
}

}  // namespace mpiformer::test
