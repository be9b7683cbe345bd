// The element types of the GPU path. Activations and matmul inputs are `A`:
// float (precision "fp32"), bf16 (precision "bf16") or fp16 ("fp16"), as
// core/precision_plan.hpp says. Master weights,
// gradients of parameters, AdamW moments, LayerNorm statistics and losses are
// always float, so only what a matmul reads is ever rounded to bf16.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mpiformer::cuda {

using bf16 = __nv_bfloat16;
using fp16 = __half;

}  // namespace mpiformer::cuda
