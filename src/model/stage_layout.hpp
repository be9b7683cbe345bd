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
  // ZeRO 3's vocabulary windows. The vocabulary's tensors (the embedding's
  // wte on the first stage; the head's, lm_head or wte's tied copy, on the
  // last) are the stage's largest outside the blocks. Where each fits a
  // block's window they go through the windows as a block does (FSDP
  // shards them as units too): gathered before the embedding or the head,
  // their gradient reduce-scattered after each use. Each is a span
  // [begin, end) of the flat buffer, with the gap after it (its ShardPlan
  // unit); begin -1 where the stage has none. Pipeline depth 1 with tied
  // embeddings: one tensor, both spans.
  struct Span {
    int64_t begin = -1, end = -1;
    int64_t size() const { return end - begin; }
  };
  Span vocab_in, vocab_out;
  // Whether the vocabulary lives in the windows: with the blocks' weights
  // (window_weights, zero 3), where each of its spans fits a window.
  bool windows_vocab(bool window_weights) const {
    if (!window_weights || (vocab_in.begin < 0 && vocab_out.begin < 0)) return false;
    const int64_t window = block_storage();
    return vocab_in.size() <= window && vocab_out.size() <= window;
  }
  // Whether a unit (a tensor) starting at `begin` is one of the vocabulary's.
  bool is_vocab(int64_t begin) const {
    return begin >= 0 && (begin == vocab_in.begin || begin == vocab_out.begin);
  }
  // The weight window a block (i >= 0) or a vocabulary use (kVocabIn,
  // kVocabOut) goes through (gradient windows are taken in turn: the
  // stage's BlockHooks). The embedding runs before block 0's forward and
  // after its backward, the head after the last block's forward and before
  // its backward: each takes the window the block beside it does not.
  int window_of(int64_t id) const {
    if (id >= 0) return static_cast<int>(id % 2);
    return id == kVocabIn ? 1 : static_cast<int>(layers.size() % 2);
  }
  static constexpr int64_t kVocabIn = -2, kVocabOut = -3;
  // A vocabulary use's span.
  const Span& vocab(int64_t id) const { return id == kVocabIn ? vocab_in : vocab_out; }
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
