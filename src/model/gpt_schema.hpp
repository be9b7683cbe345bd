// The tensors of each model family, written once. Every other view of the
// model's parameters is generated from a family's two tables: the parameter
// table (names, shapes, offsets, decay, initialisation), the per-block
// pointer views the stage computes with, the optimizer's chunk list and the
// checkpoint's dataset names. Nothing parses a name to recover structure.
//
// The families share one list of roles (block::Tensor, outer::Tensor): a
// role a family lacks (Llama's biases, its position table) has no name in
// its table, is not in the parameter table, and its pointer is null, which
// the ops read as "no bias".
#pragma once
#include <cstdint>

#include "core/gpt_config.hpp"

namespace mpiformer {

// A dimension of a tensor, as a multiple of one of the model's sizes.
struct Extent {
  // kKv: the key (or value) channels, GptConfig::kv_dim(); kQkv: q, k and
  // v's together; kFfn: the MLP's hidden width; kExperts: a Mixture of
  // Experts' experts per sparse layer.
  enum Size : uint8_t { kEmbd, kVocab, kSeqLen, kKv, kQkv, kFfn, kExperts } size = kEmbd;
  int64_t times = 0;  // 0: the dimension does not exist (a vector)
};

enum class Init : uint8_t {
  kNormal,          // normal(0, 0.02)
  kResidualNormal,  // normal(0, 0.02 / sqrt(2 n_layer)): GPT-2 scales the
                    // projections that write into the residual stream so its
                    // variance does not grow with depth
  kOne,
  kZero,
};

// Which stage of a pipeline holds a tensor outside the blocks.
enum class Placement : uint8_t { kFirstStage, kLastStage };

// How the ranks of a tensor-parallel group divide a tensor (Megatron's
// partitioning; layouts are [out, in]):
//   kNone:  replicated (LayerNorms, the biases of row-parallel layers, wpe);
//   kRows:  contiguous rows, rank r the r-th of tp equal blocks: the
//           column-parallel MLP fc and the vocabulary-parallel wte;
//   kCols:  contiguous columns (the input dimension): the row-parallel
//           output projections;
//   kHeads: rows stacked from parts (qkv: q, k, v; Llama's fused gate and
//           up projection: gate, up), each part split into tp row blocks,
//           rank r keeping the r-th of each; the kv parts (kKv) into one
//           block per kv head where there are fewer than tp, each then
//           replicated on tp / n_kv_head neighbouring ranks.
enum class Split : uint8_t { kNone, kRows, kCols, kHeads };

struct TensorSchema {
  // The checkpoint name (block tensors: the part after "h.<i>."); null: the
  // family has no such tensor.
  const char* name;
  Extent rows, cols;
  bool decay;  // AdamW weight decay: matrices and embeddings only
  Init init;
  Placement placement;  // tensors outside the blocks only
  Split split;          // under tensor parallelism
  // kHeads: the parts, in row order (their sum is `rows`).
  Extent parts[3] = {};
};

// One transformer block, in the order of the parameter buffer. A sparse
// block (GptConfig::moe_layer) has the router and, in place of the MLP's
// four tensors, each expert's copy of them: the MLP's row of the schema
// repeated per expert (named "mlp.experts.<e>." and the rest of the
// dense name), all experts' fc_w, then all fc_b, ... (is_expert_tensor).
// A dense block has no router.
namespace block {
enum Tensor : int {
  ln1_w, ln1_b, qkv_w, qkv_b, attn_proj_w, attn_proj_b,
  ln2_w, ln2_b, router_w, fc_w, fc_b, fc_proj_w, fc_proj_b, kCount
};
inline constexpr bool is_expert_tensor(int k) { return k >= fc_w && k <= fc_proj_b; }
}  // namespace block

inline constexpr Extent kQkvParts[3] = {{Extent::kEmbd, 1}, {Extent::kKv, 1}, {Extent::kKv, 1}};

inline constexpr TensorSchema kGpt2Block[] = {
    {"ln_1.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, {}, Split::kNone},
    {"ln_1.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, {}, Split::kNone},
    {"attn.c_attn.weight", {Extent::kQkv, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, {}, Split::kHeads, {kQkvParts[0], kQkvParts[1], kQkvParts[2]}},
    {"attn.c_attn.bias", {Extent::kQkv, 1}, {}, false, Init::kZero, {}, Split::kHeads, {kQkvParts[0], kQkvParts[1], kQkvParts[2]}},
    {"attn.c_proj.weight", {Extent::kEmbd, 1}, {Extent::kEmbd, 1}, true, Init::kResidualNormal, {}, Split::kCols},
    {"attn.c_proj.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, {}, Split::kNone},
    {"ln_2.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, {}, Split::kNone},
    {"ln_2.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, {}, Split::kNone},
    {"mlp.router.weight", {Extent::kExperts, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, {}, Split::kNone},
    {"mlp.c_fc.weight", {Extent::kFfn, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, {}, Split::kRows},
    {"mlp.c_fc.bias", {Extent::kFfn, 1}, {}, false, Init::kZero, {}, Split::kRows},
    {"mlp.c_proj.weight", {Extent::kEmbd, 1}, {Extent::kFfn, 1}, true, Init::kResidualNormal, {}, Split::kCols},
    {"mlp.c_proj.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, {}, Split::kNone},
};
static_assert(sizeof(kGpt2Block) / sizeof(kGpt2Block[0]) == block::kCount,
              "one schema row per block tensor");

// Llama's block: pre-normalised by RMSNorm (weights only), q/k/v fused
// (grouped-query: k and v have n_kv_head heads), SwiGLU's gate and up
// projections fused (gate rows first), no biases.
inline constexpr TensorSchema kLlamaBlock[] = {
    {"input_layernorm.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, {}, Split::kNone},
    {nullptr, {}, {}, false, Init::kZero, {}, Split::kNone},
    {"self_attn.qkv_proj.weight", {Extent::kQkv, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, {}, Split::kHeads, {kQkvParts[0], kQkvParts[1], kQkvParts[2]}},
    {nullptr, {}, {}, false, Init::kZero, {}, Split::kNone},
    {"self_attn.o_proj.weight", {Extent::kEmbd, 1}, {Extent::kEmbd, 1}, true, Init::kResidualNormal, {}, Split::kCols},
    {nullptr, {}, {}, false, Init::kZero, {}, Split::kNone},
    {"post_attention_layernorm.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, {}, Split::kNone},
    {nullptr, {}, {}, false, Init::kZero, {}, Split::kNone},
    {"mlp.router.weight", {Extent::kExperts, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, {}, Split::kNone},
    {"mlp.gate_up_proj.weight", {Extent::kFfn, 2}, {Extent::kEmbd, 1}, true, Init::kNormal, {}, Split::kHeads, {{Extent::kFfn, 1}, {Extent::kFfn, 1}, {}}},
    {nullptr, {}, {}, false, Init::kZero, {}, Split::kNone},
    {"mlp.down_proj.weight", {Extent::kEmbd, 1}, {Extent::kFfn, 1}, true, Init::kResidualNormal, {}, Split::kCols},
    {nullptr, {}, {}, false, Init::kZero, {}, Split::kNone},
};
static_assert(sizeof(kLlamaBlock) / sizeof(kLlamaBlock[0]) == block::kCount,
              "one schema row per block tensor");

// The tensors outside the blocks. wte is the embedding; tied (GPT-2, and
// Llama with tie_embeddings) it is the LM head too: the first stage owns it,
// the last stage holds a copy. Untied, lm_head is the last stage's own.
namespace outer {
enum Tensor : int { wte, wpe, lnf_w, lnf_b, lm_head, kCount };
}  // namespace outer

inline constexpr TensorSchema kGpt2Outer[] = {
    {"wte", {Extent::kVocab, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, Placement::kFirstStage, Split::kRows},
    {"wpe", {Extent::kSeqLen, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, Placement::kFirstStage, Split::kNone},
    {"ln_f.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, Placement::kLastStage, Split::kNone},
    {"ln_f.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, Placement::kLastStage, Split::kNone},
    {nullptr, {}, {}, false, Init::kZero, Placement::kLastStage, Split::kNone},
};
static_assert(sizeof(kGpt2Outer) / sizeof(kGpt2Outer[0]) == outer::kCount,
              "one schema row per tensor outside the blocks");

inline constexpr TensorSchema kLlamaOuter[] = {
    {"embed_tokens.weight", {Extent::kVocab, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, Placement::kFirstStage, Split::kRows},
    {nullptr, {}, {}, false, Init::kZero, Placement::kFirstStage, Split::kNone},
    {"norm.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, Placement::kLastStage, Split::kNone},
    {nullptr, {}, {}, false, Init::kZero, Placement::kLastStage, Split::kNone},
    {"lm_head.weight", {Extent::kVocab, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, Placement::kLastStage, Split::kRows},
};
static_assert(sizeof(kLlamaOuter) / sizeof(kLlamaOuter[0]) == outer::kCount,
              "one schema row per tensor outside the blocks");

// A family's tables.
inline const TensorSchema* block_schema(ModelFamily f) {
  return f == ModelFamily::kLlama ? kLlamaBlock : kGpt2Block;
}
inline const TensorSchema* outer_schema(ModelFamily f) {
  return f == ModelFamily::kLlama ? kLlamaOuter : kGpt2Outer;
}

// Pointers to one block's tensors in a flat buffer (weights or gradients),
// indexed by block::Tensor; in a sparse block, the MLP's are expert 0's and
// expert e's sits e x step[k] further.
template <class T>
struct BlockView {
  T* t[block::kCount];
  int64_t step[block::kCount] = {};
  T* operator[](block::Tensor k) const { return t[k]; }
  T* expert(block::Tensor k, int64_t e) const { return t[k] == nullptr ? nullptr : t[k] + e * step[k]; }
};

}  // namespace mpiformer
