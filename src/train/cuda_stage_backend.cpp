// The GPU back end: the stage on one GPU in the op set of the run's
// precision (core/precision_plan.hpp).
#include "cuda/ops.hpp"
#include "train/training_stage.hpp"

namespace mpiformer {

std::unique_ptr<StageBackend> make_cuda_backend(const GptConfig& cfg, const StageRange& range,
                                                const StageSetup& setup, int gpu) {
  switch (setup.precision) {
    case Precision::kBf16:
      return std::make_unique<TrainingStage<cuda::Ops<cuda::bf16>>>(cfg, range, setup, gpu);
    case Precision::kFp16:
      return std::make_unique<TrainingStage<cuda::Ops<cuda::fp16>>>(cfg, range, setup, gpu);
    case Precision::kFp32:
      break;
  }
  return std::make_unique<TrainingStage<cuda::Ops<float>>>(cfg, range, setup, gpu);
}

}  // namespace mpiformer
