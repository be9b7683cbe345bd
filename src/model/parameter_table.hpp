// The parameters a pipeline stage owns, generated from the schema
// (gpt_schema.hpp): named as in GPT-2's checkpoints (without the
// "transformer." prefix), with their shapes, their place in the stage's flat
// parameter buffer, and where they sit in the model (block and schema row).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/adamw_params.hpp"
#include "core/gpt_config.hpp"
#include "model/gpt_schema.hpp"

namespace mpiformer {

// The transformer layers a stage holds and whether the stage also holds
// the embeddings (first stage) or the final norm + LM head (last stage); under tensor parallelism, which of the tp slices of its split
// tensors (gpt_schema.hpp's Split) this rank holds. The layers are one
// contiguous range, or under interleaving `chunks` ranges `chunk_stride`
// layers apart, each full_chunk() long but for the model's first chunk
// (the embedding's: chunk 0 of stage 0), which lacks `first_short` layers
// at its start, and its last (the head's: the last chunk of the last
// stage), which lacks `last_short` at its end (core/layer_chunks.hpp).
// Chunk 0 is [first_layer, last_layer); the embedding sits before chunk
// 0, the head after the last chunk.
struct StageRange {
  int64_t first_layer = 0;
  int64_t last_layer = 0;  // one past chunk 0's end
  bool has_embedding = true;
  bool has_head = true;
  int64_t tp = 1, tp_rank = 0;
  int64_t chunks = 1, chunk_stride = 0;
  int64_t first_short = 0, last_short = 0;
  // Expert parallelism: the sparse layers' experts divided over `ep` ranks
  // of the data-parallel group, this rank holding experts [ep_rank E / ep,
  // (ep_rank + 1) E / ep).
  int64_t ep = 1, ep_rank = 0;
  // The layers of a chunk that lacks none (what a slot holds).
  int64_t full_chunk() const { return last_layer - first_layer + first_short; }
  int64_t chunk_layers(int64_t c) const {
    return full_chunk() - (c == 0 ? first_short : 0) - (c == chunks - 1 ? last_short : 0);
  }
  // Chunk c's first model layer, and the stage's index of its first block.
  int64_t chunk_first(int64_t c) const {
    return c == 0 ? first_layer : first_layer - first_short + c * chunk_stride;
  }
  int64_t chunk_block(int64_t c) const { return c == 0 ? 0 : c * full_chunk() - first_short; }
  int64_t num_layers() const { return chunks * full_chunk() - first_short - last_short; }
  // Where block i sits in its chunk's slot, as if its chunk lacked none: a
  // short first chunk's blocks end at the slot's end, a short last chunk's
  // start at its start, so every chunk that receives its input from
  // another stage finds it at the slot's start and every chunk that sends
  // leaves it at the end.
  int64_t slot_position(int64_t i) const { return (i + first_short) % full_chunk(); }
  // The positions [lo, hi) of a slot that holds only chunk 0 (`first_only`)
  // or only the last chunk (`last_only`), or both (one chunk), or any
  // chunk: what it allocates (core/slot_kinds.hpp).
  std::pair<int64_t, int64_t> slot_span(bool first_only, bool last_only) const {
    return {first_only ? first_short : 0, full_chunk() - (last_only ? last_short : 0)};
  }
  // The model layer of the stage's i-th block (blocks in layer order).
  int64_t layer(int64_t i) const {
    const int64_t j = i + first_short, per = full_chunk();
    return first_layer - first_short + j / per * chunk_stride + j % per;
  }
  // The stage's block index of model layer `l`, -1 if it holds none.
  int64_t block_of(int64_t l) const {
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t at = l - chunk_first(c);
      if (at >= 0 && at < chunk_layers(c)) return chunk_block(c) + at;
    }
    return -1;
  }
};

// Chunk c of an interleaved stage as a stage of its own (the embedding
// with chunk 0, the head with the last): what its pass computes.
inline StageRange chunk_range(const StageRange& r, int64_t c) {
  StageRange x = r;
  x.first_layer = r.chunk_first(c);
  x.last_layer = x.first_layer + r.chunk_layers(c);
  x.has_embedding = r.has_embedding && c == 0;
  x.has_head = r.has_head && c == r.chunks - 1;
  x.chunks = 1;
  x.chunk_stride = 0;
  x.first_short = x.last_short = 0;
  return x;
}

// Layers are split as evenly as possible; the first (n_layer % pp) stages get
// one layer more. A stage may hold zero layers only if pp > n_layer, which the
// deck validation rejects. With chunks > 1 (interleaving), the layers are
// cut into pp x chunks chunks by layer_chunks (the deck refuses what it
// refuses), chunk c of stage s being the model's (c pp + s)-th.
StageRange partition_stage(const GptConfig& cfg, int64_t stage, int64_t num_stages,
                           int64_t tp = 1, int64_t tp_rank = 0, int64_t chunks = 1);

// A block of a tensor in logical (checkpoint) coordinates, [row, row + rows)
// x [col, col + cols), and where it sits in a rank's slice: its rows
// [local_row, local_row + rows), whole (a slice's row is `cols` long).
struct LogicalBox {
  int64_t row = 0, rows = 0, col = 0, cols = 0;
  int64_t local_row = 0;
};

struct ParameterSpec {
  std::string name;
  // This rank's slice (the whole tensor unless split under tensor
  // parallelism); wte's counts real rows only: [vocab_size, n_embd] whole.
  std::vector<int64_t> shape;
  std::vector<int64_t> logical_shape;  // the whole tensor, as checkpoints hold it
  Split split = Split::kNone;          // effective: kNone whenever tp = 1
  int64_t tp = 1, tp_rank = 0;
  int64_t offset = 0;          // into the flat buffer
  int64_t storage = 0;         // elements reserved (wte: its padded rows * n_embd)
  bool decay = false;          // AdamW weight decay: matrices and embeddings only
  double init_std = 0.0;       // normal(0, init_std); 0 means constant init_value
  double init_value = 0.0;
  int64_t layer = -1;  // the block it belongs to; -1 outside the blocks
  int tensor = 0;      // its role: block::Tensor (layer >= 0) or outer::Tensor
  // A sparse block's MLP tensors: the expert's index in the model, and
  // among the experts this rank holds (expert parallelism).
  int64_t expert = -1, local_expert = -1;
  // kHeads: the logical rows of each stacked part (qkv: q, k, v), and how
  // many row blocks each is cut into: tp, or (k and v over a tensor group
  // wider than the kv heads) one per head, each block then held by
  // tp / ways neighbouring tensor ranks (GptConfig::kv_ways).
  std::vector<int64_t> parts, part_ways;
  const TensorSchema* row = nullptr;  // its row of the family's schema
  const TensorSchema& schema() const { return *row; }
  int64_t numel() const;
  // Elements of one row of the slice (1 for a vector).
  int64_t row_length() const;
  int64_t logical_numel() const;
  // Whether this rank holds the whole tensor (replicated or tp = 1).
  bool whole() const { return split == Split::kNone; }
  // Where rows [row_begin, row_end) of the slice sit in the whole tensor: one
  // box, or (kHeads) one per part, in slice order.
  std::vector<LogicalBox> boxes(int64_t row_begin, int64_t row_end) const;
  // The same without the rows another tensor rank holds too unless this
  // rank is the first of those holding them: every rank's owned boxes tile
  // the tensor once (what a checkpoint writes and its checksum reads).
  std::vector<LogicalBox> owned_boxes(int64_t row_begin, int64_t row_end) const;
  // The slice's rows that are replicated over part of the tensor group
  // ([begin, end), empty where none) and how many ranks hold each of them;
  // whether this rank is the first of them (counts them in the norm).
  struct Rows {
    int64_t begin = 0, end = 0;
  };
  Rows shared_rows() const;
  Rows shared_rows_in(int64_t row_begin, int64_t row_end) const {
    Rows r = shared_rows();
    r.begin = r.begin > row_begin ? r.begin : row_begin;
    r.end = r.end < row_end ? r.end : row_end;
    if (r.end < r.begin) r.end = r.begin;
    return r;
  }
  int64_t share() const;
  bool owns_shared() const { return tp_rank % share() == 0; }
  // The first row of the whole vocabulary in this slice (wte).
  int64_t vocab_begin() const;
};

class ParameterTable {
 public:
  ParameterTable(const GptConfig& cfg, const StageRange& range);
  const std::vector<ParameterSpec>& specs() const { return specs_; }
  const ParameterSpec& at(const std::string& name) const;
  // Null when this stage does not hold `name`.
  const ParameterSpec* find(const std::string& name) const;
  int64_t total_storage() const { return total_; }
  // Real parameters (padding excluded).
  int64_t total_numel() const;
  // The embedding where it is also the LM head and this stage holds it (the
  // copy the first and last stages keep equal); null otherwise.
  const ParameterSpec* tied_embedding() const {
    return tied_ < 0 ? nullptr : &specs_[static_cast<size_t>(tied_)];
  }

 private:
  void add(const GptConfig& cfg, const StageRange& range, const TensorSchema& schema,
           std::string name, int64_t layer, int tensor);
  std::vector<ParameterSpec> specs_;
  int64_t total_ = 0;
  int64_t tied_ = -1;  // index into specs_ (the table may be copied)
};

// The optimizer's description of a stage: every tensor's logical elements
// (never wte's padding) as chunks, flagged for weight decay by the schema.
// The host and the GPU AdamW both consume it.
std::vector<AdamWChunk> adamw_chunks(const ParameterTable& table);

}  // namespace mpiformer
