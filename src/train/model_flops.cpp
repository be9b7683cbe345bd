#include "train/model_flops.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "host/gemm.hpp"
#include "model/parameter_table.hpp"

namespace mpiformer {

double training_flops_per_token(const GptConfig& cfg) {
  StageRange all{0, cfg.n_layer, true, true};
  ParameterTable table(cfg, all);
  const double n = static_cast<double>(table.total_numel() - table.at("wpe").numel());
  return 6.0 * n + 12.0 * static_cast<double>(cfg.n_layer * cfg.seq_len * cfg.n_embd);
}

double measure_sgemm_peak(int64_t n, int repeats) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  host::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    host::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return 2.0 * static_cast<double>(n) * n * n / best;
}

}  // namespace mpiformer
