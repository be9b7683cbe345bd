// The stage on the host: float for training, double for gradient checks.
#include "model/gpt_stage_impl.hpp"

namespace mpiformer {

template class GptStage<host::Ops<float>>;
template class GptStage<host::Ops<double>>;

}  // namespace mpiformer
