// The stage on the host: float for training, double for gradient checks,
// and the 16-bit storage types of precision "bf16" and "fp16".
#include "model/gpt_stage_impl.hpp"

namespace mpiformer {

template class GptStage<host::Ops<float>>;
template class GptStage<host::Ops<double>>;
template class GptStage<host::Ops<host::Bf16>>;
template class GptStage<host::Ops<host::Fp16>>;

}  // namespace mpiformer
