// The NCCL this binary was linked with, for --version and the run log
// ("none" in builds without CUDA).
#pragma once
#include <string>

namespace mpiformer {
std::string nccl_version();
}  // namespace mpiformer
