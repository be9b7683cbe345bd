// AdamW over a stage's parameter table: first and second moments per
// parameter, weight decay only on tensors the table marks (matrices and
// embeddings), global-norm clipping folded into the update.
#pragma once
#include <cstdint>
#include <vector>

#include "model/parameter_table.hpp"

namespace mpiformer {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

template <class T>
class AdamWOptimizer {
 public:
  AdamWOptimizer(const ParameterTable& table, const AdamWSettings& s);
  // One update; `step` is 1-based; every gradient is first multiplied by
  // grad_scale (the clipping factor).
  void update(T* params, const T* grads, double lr, int64_t step, double grad_scale);
  std::vector<T>& m() { return m_; }
  std::vector<T>& v() { return v_; }

 private:
  const ParameterTable& table_;
  AdamWSettings s_;
  std::vector<T> m_, v_;
};

extern template class AdamWOptimizer<float>;
extern template class AdamWOptimizer<double>;

}  // namespace mpiformer
