// The Llama family's tensors under Hugging Face's LlamaForCausalLM
// convention, derived from the schema (gpt_schema.hpp), so a new tensor
// cannot be forgotten: names under "model." ("model.layers.<i>." for a
// block's), [out, in] matrices as ours (nn.Linear), q, k and v as three
// tensors (our fused projection's row parts, in order) and gate and up as
// two. Rotary pairs are (i, i + head_size/2) in both (HF's rotate_half),
// so q and k rows are not permuted: they round-trip exactly. The head is
// "lm_head.weight" unless tied (then absent, tie_word_embeddings true).
// A Mixture of Experts is Mixtral's layout (MixtralForCausalLM: every
// layer sparse): "block_sparse_moe.gate" the router, each expert's w1, w3
// and w2 the gate, up and down projections.
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
  std::vector<std::string> names;
  if (s.tensor == block::qkv_w) names = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight"};
  if (s.tensor == block::fc_w) names = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
  // Mixtral's sparse block: the router is the "gate"; expert e's w1 (gate),
  // w3 (up) and w2 (down).
  const std::string moe = prefix + "block_sparse_moe.";
  if (s.tensor == block::router_w) return {{moe + "gate.weight", 0, s.logical_shape[0]}};
  if (s.expert >= 0) {
    const std::string e = moe + "experts." + std::to_string(s.expert) + ".";
    if (s.tensor == block::fc_w) names = {e + "w1.weight", e + "w3.weight"};
    else return {{e + "w2.weight", 0, s.logical_shape[0]}};  // down_proj
    return {{names[0], 0, s.parts.at(0)}, {names[1], s.parts.at(0), s.parts.at(1)}};
  }
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
