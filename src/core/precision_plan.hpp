// The precision plan: for each [train] precision, which tensors are stored
// in which element type, where the fp32 master weights, the moments and the
// gradient accumulation live, and what travels between ranks in which type.
// Written once; both back ends follow it (each op set's Act type is checked
// against it where the stage is instantiated) and the memory accounting
// sizes every buffer from it.
//
//   tensor                                  fp32   bf16   fp16
//   activations, their gradients, the
//     weights the matmuls read (a copy)     f32    bf16   fp16
//   pipeline messages, tensor-group sums
//     of activations                        f32    bf16   fp16
//   master weights, parameter gradients
//     (accumulated over micro-batches),
//     AdamW moments, data-parallel
//     reductions, checkpoints               f32    f32    f32
//   LayerNorm statistics, losses,
//     attention's kept state                f32    f32    f32
//   matmuls accumulate in                   f32    f32    f32
//
// In fp32 the weights the matmuls read are the master weights themselves
// (one buffer); otherwise the copy is refreshed from the masters by AdamW.
// fp16's narrow range needs the loss scaled before backward and the
// gradients unscaled before the update (train/loss_scaler.hpp); bf16 has
// float's range and needs none.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/settings.hpp"

namespace mpiformer {

// An element type as communicators and the accounting see it.
enum class Element : uint8_t { kF32, kF64, kBf16, kF16 };

constexpr size_t element_bytes(Element e) {
  return e == Element::kF64 ? 8 : (e == Element::kF32 ? 4 : 2);
}
constexpr const char* element_name(Element e) {
  return e == Element::kF32 ? "f32" : e == Element::kF64 ? "f64" : e == Element::kBf16 ? "bf16" : "f16";
}

struct PrecisionPlan {
  Precision precision;
  Element activations;  // activations, activation gradients, the weight copy, what they send
  Element master;       // master weights, gradients, moments, reductions, checkpoints
  Element statistics;   // LayerNorm statistics, losses, attention's kept state
  bool weight_copy;     // the matmuls read a copy of the masters in `activations`
  bool loss_scaling;    // the loss is scaled and the gradients unscaled (fp16)
};

constexpr PrecisionPlan precision_plan(Precision p) {
  switch (p) {
    case Precision::kBf16:
      return {p, Element::kBf16, Element::kF32, Element::kF32, true, false};
    case Precision::kFp16:
      return {p, Element::kF16, Element::kF32, Element::kF32, true, true};
    case Precision::kFp32:
    default:
      return {p, Element::kF32, Element::kF32, Element::kF32, false, false};
  }
}

// [train] offload moves the float masters out with the moments where the
// matmuls read a copy of them (mixed precision): the update then needs
// only the gradients and writes only the copy. In fp32 the masters are the
// weights the matmuls read, so they stay in the back end's memory.
constexpr bool masters_offloaded(Offload where, bool weight_copy) {
  return where != Offload::kNone && weight_copy;
}

}  // namespace mpiformer
