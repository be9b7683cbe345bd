// Constants of the model's ops that both kernel back ends must agree on.
#pragma once

namespace mpiformer {

// GPT-2's LayerNorm epsilon (added to the variance before the square root).
constexpr double kLayerNormEps = 1e-5;

}  // namespace mpiformer
