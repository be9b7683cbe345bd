// The host back end: the stage on the CPU in fp32.
#include "train/training_stage.hpp"

namespace mpiformer {

std::unique_ptr<StageBackend> make_host_backend(const GptConfig& cfg, const StageRange& range,
                                                int64_t micro_batch, int slots,
                                                const AdamWSettings& adam) {
  return std::make_unique<TrainingStage<host::Ops<float>>>(cfg, range, micro_batch, slots, adam);
}

}  // namespace mpiformer
