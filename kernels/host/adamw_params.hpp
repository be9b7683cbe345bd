// The settings of one AdamW update, shared by the host and GPU kernels.
#pragma once
#include <cstdint>

namespace mpiformer {

struct AdamWParams {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int64_t step;        // 1-based, for bias correction
  double grad_scale;   // multiplies every gradient first (clipping)
};

namespace host {
using mpiformer::AdamWParams;
}

}  // namespace mpiformer
