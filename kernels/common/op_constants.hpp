// Constants of the model's ops that both kernel back ends must agree on.
#pragma once

namespace mpiformer {

// GPT-2's LayerNorm epsilon (added to the variance before the square root).
constexpr double kLayerNormEps = 1e-5;

// The CUDA context's workspace: cuBLASLt's (Hopper's kernels want up to
// 32 MiB), which the column-sum kernels also use between GEMMs. Here so the
// memory accounting can count it without the CUDA headers.
constexpr unsigned long kDeviceWorkspaceBytes = 32ul << 20;

}  // namespace mpiformer
