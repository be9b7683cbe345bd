// Where a stage's tensors sit in its flat parameter buffer, resolved once
// from the parameter table (so from the schema), and GPT-2's initial
// values: shared by every device's stage so all hold the same model in the
// same places.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "model/parameter_table.hpp"

namespace mpiformer {

struct StageLayout {
  std::vector<std::array<int64_t, block::kCount>> layers;  // per block of the stage
  // A sparse block's expert tensors: the distance from one expert's to the
  // next (0 elsewhere).
  std::vector<std::array<int64_t, block::kCount>> steps;
  std::array<int64_t, outer::kCount> outer;                 // -1: not on this stage

  StageLayout(const ParameterTable& table, const StageRange& range);

  // The offset of a tensor outside the blocks (-1: none here).
  int64_t at(outer::Tensor k) const { return outer[k]; }
  // The LM head's: its own, or the tied embedding's.
  int64_t head() const { return outer[outer::lm_head] >= 0 ? outer[outer::lm_head] : outer[outer::wte]; }
  // Pointers into a flat buffer (weights or gradients) for the stage's block
  // i; null for a tensor the family lacks.
  template <class T>
  BlockView<T> block(T* base, int64_t i) const {
    return block_at(base + layers[i][0], i);
  }
  // The same, for a buffer holding block i alone (a ZeRO window).
  template <class T>
  BlockView<T> block_at(T* block_base, int64_t i) const {
    BlockView<T> v;
    for (int k = 0; k < block::kCount; ++k) {
      v.t[k] = layers[i][k] < 0 ? nullptr : block_base + (layers[i][k] - layers[i][0]);
      v.step[k] = steps[i][k];
    }
    return v;
  }
  // The blocks' span of the flat buffer [block_begin, block_end): the blocks
  // are contiguous, between the first stage's tensors and the last's; equally
  // sized unless some are sparse and some dense (moe_every > 1).
  int64_t block_begin() const { return layers.empty() ? 0 : layers.front()[0]; }
  int64_t block_end = 0;
  int64_t block_span() const { return layers.empty() ? 0 : block_end - block_begin(); }
  // ZeRO's vocabulary windows. The vocabulary's tensors (the embedding's
  // wte on the first stage; the head's, lm_head or wte's tied copy, on the
  // last) are the stage's largest outside the blocks. At zero 3 they go
  // through the blocks' windows (FSDP shards them as units too): gathered
  // before the embedding or the head, their gradient reduce-scattered
  // after each use, so nothing of them stays whole. At zero 2 their
  // gradients alone do (the weights stay whole). One larger than a
  // window goes in row pieces of at most a window each, one after another
  // (Llama 3's 128K vocabulary is 2.4 blocks' worth at 8B). Each tensor is
  // a span [begin, end) of the flat buffer, with the gap after it (its
  // ShardPlan unit); begin -1 where the stage has none. Pipeline depth 1
  // with tied embeddings: one tensor, both spans.
  struct Span {
    int64_t begin = -1, end = -1;
    int64_t row = 1;   // the tensor's row length
    int64_t rows = 0;  // its stored rows (wte's padding rows too)
    int64_t size() const { return end - begin; }
  };
  Span vocab_in, vocab_out;
  // Whether the vocabulary lives in the windows where the blocks' weights
  // or gradients do (`windowed`: StageOptions' window_weights, or
  // window_vocab_grads for its gradients): wherever the stage has it and a
  // window holds a row of it (a stage has blocks).
  bool windows_vocab(bool windowed) const {
    if (!windowed || (vocab_in.begin < 0 && vocab_out.begin < 0)) return false;
    for (const Span* s : {&vocab_in, &vocab_out})
      if (s->begin >= 0 && s->size() - s->rows * s->row + s->row > block_storage()) return false;
    return true;
  }
  // Whether a unit (a tensor) starting at `begin` is one of the vocabulary's.
  bool is_vocab(int64_t begin) const {
    return begin >= 0 && (begin == vocab_in.begin || begin == vocab_out.begin);
  }
  // The weight window a block (i >= 0) or a vocabulary use's piece goes
  // through (gradient windows are taken in turn: the stage's BlockHooks).
  // The embedding runs before block 0's forward and after its backward,
  // the head after the last block's forward and before its backward: the
  // piece next to the block takes the window the block does not, and the
  // pieces alternate so each may be fetched while the one before computes.
  int window_of(int64_t id) const {
    if (id >= 0) return static_cast<int>(id % 2);
    const int64_t k = piece_index(id);
    if (piece_use(id) == kVocabIn) return static_cast<int>((vocab_pieces(kVocabIn) - k) % 2);
    return static_cast<int>((static_cast<int64_t>(layers.size()) + k) % 2);
  }
  // The vocabulary's uses, and the ids of their pieces: piece k of use u is
  // u - 2 k (piece 0 is the use itself), below every block's id.
  static constexpr int64_t kVocabIn = -2, kVocabOut = -3;
  static int64_t piece_id(int64_t use, int64_t k) { return use - 2 * k; }
  static int64_t piece_use(int64_t id) { return id % 2 == 0 ? kVocabIn : kVocabOut; }
  static int64_t piece_index(int64_t id) { return (piece_use(id) - id) / 2; }
  // A vocabulary use's tensor.
  const Span& vocab(int64_t id) const { return piece_use(id) == kVocabIn ? vocab_in : vocab_out; }
  // The rows a piece holds: as many as a window takes beside the span's
  // gap (the last piece carries it), so every piece fits a window; a
  // multiple of 8 where that leaves any, so each piece's columns of the
  // logits start 16-byte aligned for the GPU's GEMMs.
  int64_t piece_rows(int64_t use) const {
    const Span& s = vocab(use);
    const int64_t gap = s.size() - s.rows * s.row;
    const int64_t rows = std::max<int64_t>(1, (block_storage() - gap) / s.row);
    return rows >= 8 ? rows - rows % 8 : rows;
  }
  int64_t vocab_pieces(int64_t use) const {
    const Span& s = vocab(use);
    const int64_t per = piece_rows(use);
    return std::max<int64_t>(1, (s.rows + per - 1) / per);
  }
  // Piece `id`'s first row and its span of the flat buffer (the last to
  // the tensor's end, its gap included).
  int64_t piece_row(int64_t id) const { return piece_index(id) * piece_rows(piece_use(id)); }
  Span piece(int64_t id) const {
    const int64_t use = piece_use(id), k = piece_index(id);
    const Span& s = vocab(use);
    Span p = s;
    p.begin = s.begin + piece_row(id) * s.row;
    if (k + 1 < vocab_pieces(use)) p.end = p.begin + piece_rows(use) * s.row;
    p.rows = std::min(piece_rows(use), s.rows - piece_row(id));
    return p;
  }
  // Where a tensor at `table_offset` sits in a buffer that holds only the
  // tensors outside the windows (`windowed`: the blocks live in ZeRO's
  // windows or 16-bit sums; `vocab`: the vocabulary too): those after a
  // windowed span move down by its size. At the buffer's end, its size.
  int64_t resident_offset(int64_t table_offset, bool windowed, bool vocab = false) const {
    int64_t at = windowed && table_offset >= block_end ? table_offset - block_span() : table_offset;
    if (!vocab) return at;
    if (vocab_in.begin >= 0 && vocab_in.end <= table_offset) at -= vocab_in.size();
    if (vocab_out.begin >= 0 && vocab_out.begin != vocab_in.begin && vocab_out.end <= table_offset)
      at -= vocab_out.size();
    return at;
  }
  // Zero 1's 16-bit gradient sums ([train] grad_dtype = bf16): the
  // blocks' span, then (`vocab`: its gradients go through the windows)
  // the vocabulary's tensors, one after another. Where the sums of the
  // element at `table_offset` sit, and how many there are.
  int64_t sums_offset(int64_t table_offset, bool vocab) const {
    if (!vocab || !is_vocab_element(table_offset)) return table_offset - block_begin();
    const bool in =
        vocab_in.begin >= 0 && table_offset >= vocab_in.begin && table_offset < vocab_in.end;
    const int64_t before = in || vocab_in.begin < 0 ? 0 : vocab_in.size();
    return block_span() + before + table_offset - (in ? vocab_in.begin : vocab_out.begin);
  }
  int64_t sums_size(bool vocab) const {
    if (!vocab) return block_span();
    return block_span() + (vocab_in.begin >= 0 ? vocab_in.size() : 0) +
           (vocab_out.begin >= 0 && vocab_out.begin != vocab_in.begin ? vocab_out.size() : 0);
  }
  // Whether the element at `offset` is in one of the vocabulary's tensors.
  bool is_vocab_element(int64_t offset) const {
    for (const Span* v : {&vocab_in, &vocab_out})
      if (v->begin >= 0 && offset >= v->begin && offset < v->end) return true;
    return false;
  }
  // Block i's span: [layers[i][0], block_stop(i)).
  int64_t block_stop(int64_t i) const {
    return i + 1 < static_cast<int64_t>(layers.size()) ? layers[static_cast<size_t>(i) + 1][0] : block_end;
  }
  // The block holding `offset` (one inside the blocks' span).
  int64_t block_at_offset(int64_t offset) const {
    const auto after = std::upper_bound(layers.begin(), layers.end(), offset,
                                        [](int64_t o, const auto& b) { return o < b[0]; });
    return static_cast<int64_t>(after - layers.begin()) - 1;
  }
  // Which of the forward's uses first reads the tensor at `offset`: its
  // block, else the embedding (kVocabIn: wte, wpe; on a stage with both
  // ends the tied wte too) or the final norm and the head (kVocabOut: the
  // last stage's lm_head or tied copy).
  int64_t use_of(int64_t offset) const {
    if (!layers.empty() && offset >= block_begin() && offset < block_end)
      return block_at_offset(offset);
    if (offset == vocab_in.begin) return kVocabIn;
    if (offset == vocab_out.begin || offset == at(outer::lnf_w) || offset == at(outer::lnf_b))
      return kVocabOut;
    return kVocabIn;
  }
  // The largest block's storage (a window holds any block).
  int64_t block_storage() const {
    int64_t most = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(layers.size()); ++i)
      most = std::max(most, block_stop(i) - layers[static_cast<size_t>(i)][0]);
    return most;
  }
};

// GPT-2 initialisation of one tensor into out[s.storage] (padding zero);
// its values depend only on (seed, name), so every layout and device
// initialises the same model: a tensor-parallel slice is cut from the whole
// tensor as drawn.
template <class T>
void fill_initial_tensor(const ParameterSpec& s, uint64_t seed, T* out) {
  std::fill(out, out + s.storage, T(0));
  if (s.init_std == 0.0) {
    std::fill(out, out + s.numel(), static_cast<T>(s.init_value));
    return;
  }
  Rng rng(seed, s.name);
  if (s.whole()) {
    for (int64_t i = 0; i < s.numel(); ++i) out[i] = static_cast<T>(s.init_std * rng.normal());
    return;
  }
  std::vector<T> whole(static_cast<size_t>(s.logical_numel()));
  for (T& x : whole) x = static_cast<T>(s.init_std * rng.normal());
  const int64_t width = s.logical_shape.size() > 1 ? s.logical_shape[1] : 1;
  for (const LogicalBox& b : s.boxes(0, s.shape[0]))
    for (int64_t r = 0; r < b.rows; ++r)
      std::copy_n(whole.data() + (b.row + r) * width + b.col, b.cols,
                  out + (b.local_row + r) * b.cols);
}

// The whole stage into `out` (table order).
template <class T>
void fill_initial_parameters(const ParameterTable& table, uint64_t seed, T* out) {
  for (const auto& s : table.specs()) fill_initial_tensor(s, seed, out + s.offset);
}

}  // namespace mpiformer
