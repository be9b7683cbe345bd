// GPT-2's tensors under other tools' conventions, derived from the schema
// (gpt_schema.hpp) of the whole model, so a new tensor cannot be forgotten:
//  - Hugging Face transformers' GPT2LMHeadModel: our names under
//    "transformer." (the embeddings as "wte.weight", "wpe.weight"); its
//    Conv1D layers store a block's four matrices as [in, out], the
//    transpose of ours; lm_head is tied to wte and not stored;
//  - llm.c's gpt2_*.bin: the same [out, in] layouts as ours, the
//    vocabulary padded, tensors grouped by kind (all layers' ln_1.weight,
//    then all ln_1.bias, ...), in the schema's block order.
#pragma once
#include <string>
#include <vector>

#include "model/parameter_table.hpp"

namespace mpiformer {

inline std::string hf_name(const ParameterSpec& s) {
  const bool embedding = s.layer < 0 && (s.tensor == outer::wte || s.tensor == outer::wpe);
  return "transformer." + s.name + (embedding ? ".weight" : "");
}

// Whether Hugging Face stores the tensor transposed (a block's matrices).
inline bool hf_transposed(const ParameterSpec& s) { return s.layer >= 0 && s.shape.size() == 2; }

// The whole model's tensors in llm.c's file order.
inline std::vector<const ParameterSpec*> llmc_order(const ParameterTable& whole) {
  std::vector<const ParameterSpec*> out;
  const auto outer_tensor = [&](int k) {
    for (const auto& s : whole.specs())
      if (s.layer < 0 && s.tensor == k) out.push_back(&s);
  };
  outer_tensor(outer::wte);
  outer_tensor(outer::wpe);
  for (int k = 0; k < block::kCount; ++k)
    for (const auto& s : whole.specs())
      if (s.layer >= 0 && s.tensor == k) out.push_back(&s);
  outer_tensor(outer::lnf_w);
  outer_tensor(outer::lnf_b);
  return out;
}

}  // namespace mpiformer
