// Model FLOPs per token and the machine peak they are compared with (MFU).
#pragma once
#include <cstdint>

#include "model/gpt_config.hpp"

namespace mpiformer {

// Training FLOPs per token, nanoGPT/PaLM convention: 6 N for the parameter
// matrices (N excludes the position table, a lookup) plus 12 L T C for the
// attention score and value products, forward and backward.
double training_flops_per_token(const GptConfig& cfg);

// FLOP/s of a large square sgemm on this rank with the current BLAS threads:
// the practical fp32 peak MFU is measured against.
double measure_sgemm_peak(int64_t n = 2048, int repeats = 3);

}  // namespace mpiformer
