// The host back end: the stage on the CPU in fp32.
#include "train/training_stage.hpp"

namespace mpiformer {

std::unique_ptr<StageBackend> make_host_backend(const GptConfig& cfg, const StageRange& range,
                                                const StageSetup& setup) {
  return std::make_unique<TrainingStage<host::Ops<float>>>(cfg, range, setup);
}

}  // namespace mpiformer
