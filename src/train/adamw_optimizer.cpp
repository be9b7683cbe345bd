#include "train/adamw_optimizer.hpp"

#include "host/adamw.hpp"

namespace mpiformer {

template <class T>
AdamWOptimizer<T>::AdamWOptimizer(const ParameterTable& table, const AdamWSettings& s)
    : table_(table), s_(s), m_(table.total_storage(), T(0)), v_(table.total_storage(), T(0)) {}

template <class T>
void AdamWOptimizer<T>::update(T* params, const T* grads, double lr, int64_t step,
                               double grad_scale) {
  for (const auto& spec : table_.specs()) {
    host::AdamWParams p{lr,  s_.beta1, s_.beta2, s_.eps, spec.decay ? s_.weight_decay : 0.0,
                        step, grad_scale};
    const int64_t o = spec.offset;
    // Only the logical elements: the padded rows of wte stay exactly zero.
    host::adamw_update(params + o, grads + o, m_.data() + o, v_.data() + o, spec.numel(), p);
  }
}

template class AdamWOptimizer<float>;
template class AdamWOptimizer<double>;

}  // namespace mpiformer
