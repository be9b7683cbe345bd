// The host back end: the stage on the CPU, in the op set of the run's
// precision (its Act type checked against the precision plan).
#include <stdexcept>

#include "train/training_stage.hpp"

namespace mpiformer {

namespace {
template <class A>
std::unique_ptr<StageBackend> host_stage(const GptConfig& cfg, const StageRange& range,
                                         const StageSetup& setup) {
  static_assert(host::Ops<A>::kActElement == host::element_of<A>());
  if (precision_plan(setup.precision).activations != host::Ops<A>::kActElement)
    throw std::logic_error("make_host_backend: the op set does not follow the precision plan");
  return std::make_unique<TrainingStage<host::Ops<A>>>(cfg, range, setup);
}
}  // namespace

std::unique_ptr<StageBackend> make_host_backend(const GptConfig& cfg, const StageRange& range,
                                                const StageSetup& setup) {
  switch (setup.precision) {
    case Precision::kBf16:
      return host_stage<host::Bf16>(cfg, range, setup);
    case Precision::kFp16:
      return host_stage<host::Fp16>(cfg, range, setup);
    case Precision::kFp32:
      break;
  }
  return host_stage<float>(cfg, range, setup);
}

}  // namespace mpiformer
