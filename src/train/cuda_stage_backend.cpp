// The GPU back end: the stage on one GPU in fp32 or bf16.
#include "cuda/ops.hpp"
#include "train/training_stage.hpp"

namespace mpiformer {

std::unique_ptr<StageBackend> make_cuda_backend(const GptConfig& cfg, const StageRange& range,
                                                const StageSetup& setup, int gpu, bool bf16) {
  if (bf16) return std::make_unique<TrainingStage<cuda::Ops<cuda::bf16>>>(cfg, range, setup, gpu);
  return std::make_unique<TrainingStage<cuda::Ops<float>>>(cfg, range, setup, gpu);
}

}  // namespace mpiformer
