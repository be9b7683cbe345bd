// The Llama family's tensors under Hugging Face's LlamaForCausalLM
// convention, derived from the schema (gpt_schema.hpp), so a new tensor
// cannot be forgotten: names under "model." ("model.layers.<i>." for a
// block's), [out, in] matrices as ours (nn.Linear), q, k and v as three
// tensors (our fused projection's row parts, in order) and gate and up as
// two. Rotary pairs are (i, i + head_size/2) in both (HF's rotate_half),
// so q and k rows are not permuted: they round-trip exactly. The head is
// "lm_head.weight" unless tied (then absent, tie_word_embeddings true).
#pragma once
#include <string>
#include <vector>

#include "model/parameter_table.hpp"

namespace mpiformer {

// Rows [row, row + rows) of one of our tensors, which HF stores whole as `name`.
struct HfPart {
  std::string name;
  int64_t row = 0, rows = 0;
};

inline std::vector<HfPart> hf_llama_parts(const ParameterSpec& s) {
  if (s.layer < 0) {
    const std::string name = s.tensor == outer::lm_head ? s.name : "model." + s.name;
    return {{name, 0, s.logical_shape[0]}};
  }
  const std::string prefix = "model.layers." + std::to_string(s.layer) + ".";
  const std::string tail = s.schema().name;
  std::vector<const char*> names;
  if (s.tensor == block::qkv_w) names = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight"};
  if (s.tensor == block::fc_w) names = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
  if (names.empty()) return {{prefix + tail, 0, s.logical_shape[0]}};
  std::vector<HfPart> out;
  int64_t row = 0;
  for (size_t p = 0; p < names.size(); ++p) {
    out.push_back({prefix + names[p], row, s.parts.at(p)});
    row += s.parts[p];
  }
  return out;
}

}  // namespace mpiformer
