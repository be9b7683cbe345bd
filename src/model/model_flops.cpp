#include "model/model_flops.hpp"

#include "model/parameter_table.hpp"

namespace mpiformer {

double training_flops_per_token(const GptConfig& cfg) {
  StageRange all{0, cfg.n_layer, true, true};
  ParameterTable table(cfg, all);
  const double n = static_cast<double>(table.total_numel() - table.at("wpe").numel());
  return 6.0 * n + 12.0 * static_cast<double>(cfg.n_layer * cfg.seq_len * cfg.n_embd);
}

}  // namespace mpiformer
