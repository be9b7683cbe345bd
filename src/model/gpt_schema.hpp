// The tensors of GPT-2, written once. Every other view of the model's
// parameters is generated from these two tables: the parameter table (names,
// shapes, offsets, decay, initialisation), the per-block pointer views the
// stage computes with, the optimizer's chunk list and the checkpoint's
// dataset names. Nothing parses a name to recover structure.
#pragma once
#include <cstdint>

namespace mpiformer {

// A dimension of a tensor, as a multiple of one of the model's sizes.
struct Extent {
  enum Size : uint8_t { kEmbd, kVocab, kSeqLen } size = kEmbd;
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
//   kHeads: qkv's rows by heads: each of its three [C, ...] blocks (q, k,
//           v) split into tp row blocks, rank r keeping the r-th of each.
enum class Split : uint8_t { kNone, kRows, kCols, kHeads };

struct TensorSchema {
  const char* name;  // GPT-2's (block tensors: the part after "h.<i>.")
  Extent rows, cols;
  bool decay;  // AdamW weight decay: matrices and embeddings only
  Init init;
  Placement placement;  // tensors outside the blocks only
  Split split;          // under tensor parallelism
};

// One transformer block, in the order of the parameter buffer.
namespace block {
enum Tensor : int {
  ln1_w, ln1_b, qkv_w, qkv_b, attn_proj_w, attn_proj_b,
  ln2_w, ln2_b, fc_w, fc_b, fc_proj_w, fc_proj_b, kCount
};
}  // namespace block

inline constexpr TensorSchema kBlockSchema[] = {
    {"ln_1.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, {}, Split::kNone},
    {"ln_1.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, {}, Split::kNone},
    {"attn.c_attn.weight", {Extent::kEmbd, 3}, {Extent::kEmbd, 1}, true, Init::kNormal, {}, Split::kHeads},
    {"attn.c_attn.bias", {Extent::kEmbd, 3}, {}, false, Init::kZero, {}, Split::kHeads},
    {"attn.c_proj.weight", {Extent::kEmbd, 1}, {Extent::kEmbd, 1}, true, Init::kResidualNormal, {}, Split::kCols},
    {"attn.c_proj.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, {}, Split::kNone},
    {"ln_2.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, {}, Split::kNone},
    {"ln_2.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, {}, Split::kNone},
    {"mlp.c_fc.weight", {Extent::kEmbd, 4}, {Extent::kEmbd, 1}, true, Init::kNormal, {}, Split::kRows},
    {"mlp.c_fc.bias", {Extent::kEmbd, 4}, {}, false, Init::kZero, {}, Split::kRows},
    {"mlp.c_proj.weight", {Extent::kEmbd, 1}, {Extent::kEmbd, 4}, true, Init::kResidualNormal, {}, Split::kCols},
    {"mlp.c_proj.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, {}, Split::kNone},
};
static_assert(sizeof(kBlockSchema) / sizeof(kBlockSchema[0]) == block::kCount,
              "one schema row per block tensor");

// The tensors outside the blocks. wte is the tied embedding and LM head: the
// first stage owns it, the last stage holds a copy.
namespace outer {
enum Tensor : int { wte, wpe, lnf_w, lnf_b, kCount };
}  // namespace outer

inline constexpr TensorSchema kOuterSchema[] = {
    {"wte", {Extent::kVocab, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, Placement::kFirstStage, Split::kRows},
    {"wpe", {Extent::kSeqLen, 1}, {Extent::kEmbd, 1}, true, Init::kNormal, Placement::kFirstStage, Split::kNone},
    {"ln_f.weight", {Extent::kEmbd, 1}, {}, false, Init::kOne, Placement::kLastStage, Split::kNone},
    {"ln_f.bias", {Extent::kEmbd, 1}, {}, false, Init::kZero, Placement::kLastStage, Split::kNone},
};
static_assert(sizeof(kOuterSchema) / sizeof(kOuterSchema[0]) == outer::kCount,
              "one schema row per tensor outside the blocks");

// Pointers to one block's tensors in a flat buffer (weights or gradients),
// indexed by block::Tensor.
template <class T>
struct BlockView {
  T* t[block::kCount];
  T* operator[](block::Tensor k) const { return t[k]; }
};

}  // namespace mpiformer
