// Test support: a Mixture-of-Experts router written from its definition
// with sorts and plain loops (no kernel, no router code): what each token
// chooses, its gates, what capacity drops, and the losses. Shared by the
// router's tests and the MoE model's.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace mpiformer::test {

// What the router decides, written from its definition.
struct Naive {
  std::vector<std::vector<int>> chosen;  // per token, k experts by rank
  std::vector<std::vector<double>> gate;
  std::vector<std::vector<bool>> dropped;
  std::vector<std::vector<int>> chose;  // per sequence and expert, before dropping
  double aux = 0, z = 0;
};

inline Naive naive_route(const std::vector<double>& logits, int64_t N, int64_t T, int64_t E, int64_t K,
                  int64_t capacity) {
  Naive out;
  std::vector<std::vector<double>> p(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const double* l = &logits[static_cast<size_t>(n * E)];
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e]);
    for (int64_t e = 0; e < E; ++e) p[n].push_back(std::exp(l[e]) / sum);
    out.z += std::log(sum) * std::log(sum);
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    order.resize(static_cast<size_t>(K));
    double picked = 0;
    for (int e : order) picked += p[n][e];
    out.chosen.push_back(order);
    out.gate.emplace_back();
    for (int e : order) out.gate.back().push_back(p[n][e] / picked);
    out.dropped.emplace_back(static_cast<size_t>(K), false);
  }
  for (int64_t s = 0; s < N / T; ++s) {
    std::vector<int> count(static_cast<size_t>(E), 0);
    for (int64_t j = 0; j < K; ++j)
      for (int64_t t = 0; t < T; ++t) {
        const int e = out.chosen[s * T + t][j];
        if (capacity > 0 && count[e] >= capacity) out.dropped[s * T + t][j] = true;
        ++count[e];
      }
    double aux = 0;
    for (int64_t e = 0; e < E; ++e) {
      double mean = 0;
      for (int64_t t = 0; t < T; ++t) mean += p[s * T + t][e] / T;
      aux += static_cast<double>(count[e]) / (T * K) * mean;
    }
    out.aux += E * aux;
    out.chose.push_back(count);
  }
  return out;
}

}  // namespace mpiformer::test
