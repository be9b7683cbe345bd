#include "model/model_flops.hpp"

#include "model/parameter_table.hpp"

namespace mpiformer {

double training_flops_per_token(const GptConfig& cfg) {
  return training_flops_per_token(cfg, ParameterTable(cfg, StageRange{0, cfg.n_layer, true, true}));
}

double training_flops_per_token(const GptConfig& cfg, const ParameterTable& table) {
  // The matmuls' parameters: not the position table, nor (untied) the
  // embedding, which are looked up, not multiplied.
  // A Mixture of Experts' tokens each pass through top_k of its experts:
  // the active parameters count (drops not subtracted, as Megatron counts).
  int64_t looked_up = 0, experts = 0;
  for (const auto& s : table.specs()) {
    if (s.layer < 0 && (s.tensor == outer::wpe || (s.tensor == outer::wte && !cfg.tie_embeddings)))
      looked_up += s.numel();
    if (s.expert >= 0) experts += s.numel();
  }
  const double active = cfg.moe() ? static_cast<double>(experts) * static_cast<double>(cfg.top_k) /
                                        static_cast<double>(cfg.experts)
                                  : 0.0;
  const double n = static_cast<double>(table.total_numel() - looked_up - experts) + active;
  return 6.0 * n + 12.0 * static_cast<double>(cfg.n_layer * cfg.seq_len * cfg.n_embd);
}

}  // namespace mpiformer
