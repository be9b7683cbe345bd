// Model FLOPs per token (MFU's numerator; the peak comes from the back end).
#pragma once
#include <cstdint>

#include "core/gpt_config.hpp"
#include "model/parameter_table.hpp"

namespace mpiformer {

// Training FLOPs per token, nanoGPT/PaLM convention: 6 N for the parameter
// matrices (N excludes the position table, a lookup) plus 12 L T C for the
// attention score and value products, forward and backward.
double training_flops_per_token(const GptConfig& cfg);
// The same from the whole model's table (stage 0 to n_layer, with both
// ends), where the caller already holds one: building a table for each
// layout was a quarter of a 65,536-rank search's time.
double training_flops_per_token(const GptConfig& cfg, const ParameterTable& whole_model);

}  // namespace mpiformer
