// The stage on a GPU: fp32, or bf16 activations over float master weights.
#include "cuda/ops.hpp"
#include "model/gpt_stage_impl.hpp"

namespace mpiformer {

template class GptStage<cuda::Ops<float>>;
template class GptStage<cuda::Ops<cuda::bf16>>;
template class GptStage<cuda::Ops<cuda::fp16>>;

}  // namespace mpiformer
