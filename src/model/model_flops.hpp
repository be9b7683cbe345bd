// Model FLOPs per token (MFU's numerator; the peak comes from the back end).
#pragma once
#include <cstdint>

#include "core/gpt_config.hpp"

namespace mpiformer {

// Training FLOPs per token, nanoGPT/PaLM convention: 6 N for the parameter
// matrices (N excludes the position table, a lookup) plus 12 L T C for the
// attention score and value products, forward and backward.
double training_flops_per_token(const GptConfig& cfg);

}  // namespace mpiformer
