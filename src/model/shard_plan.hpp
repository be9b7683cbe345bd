// ZeRO's division of one stage's flat parameter buffer among the ranks of
// its data-parallel group. The buffer is cut into units: each tensor
// outside the blocks (wte alone, so the tied copies on the first and last
// stage are cut alike), and each block. Each unit is cut into dp parts at
// row boundaries of its tensors, as evenly as rows allow (a part holds
// whole rows, so a checkpoint writes each owner's rows as a hyperslab; a
// part may be empty). Rank r owns part r of every unit; its shard is those
// parts one after another, in unit order. A pure function of the table and
// (dp, rank): the trainer, the checkpoints and the memory accounting all
// read the same plan.
// Expert parallelism (ep > 1): a rank's experts are held by the dp / ep
// replicas ep apart, not by the whole group, so a sparse block's experts
// are a unit of their own, cut among those replicas (part dp_rank / ep,
// the group ProcessGrid::expert_data_parallel); its other tensors stay a
// unit cut over dp. Every logical element is then owned once over dp: the
// ep ranks of a group hold different experts.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/parameter_table.hpp"
#include "model/stage_layout.hpp"

namespace mpiformer {

// ZeRO's reduce-scatters of whole units in flight at once
// (train/zero_shards.hpp's reduce_resident_from; the memory accounting
// counts as many host MPI temporaries).
inline constexpr size_t kInFlight = 2;

struct ShardUnit {
  int64_t begin = 0, end = 0;  // flat offsets
  int64_t block = -1;          // the stage's block index; -1 outside the blocks
  bool experts = false;        // cut over the replicas holding the same experts (ep > 1)
  std::vector<int64_t> cuts;   // group size + 1 flat offsets: part r is [cuts[r], cuts[r + 1])
  std::vector<int64_t> counts; // the group's part sizes, what the collectives take (kept so
                               // a step allocates none)
  int64_t shard_offset = 0;    // where this rank's part sits in its shard
};

// The rows of one tensor a rank owns, and where the first sits in its shard.
struct TensorPart {
  int64_t row_begin = 0, row_end = 0;  // logical rows (wte's padding excluded)
  int64_t shard_offset = 0;
};

// A window's share of one unit: a block's whole unit, or a vocabulary
// piece's rows of its tensor's unit (StageLayout::piece). The collectives
// that fill and drain the window move it: each rank sends or receives the
// part of its own part that falls in it (none, for most ranks, of a piece).
struct WindowPart {
  size_t unit = 0;                              // index into ShardPlan::units()
  int64_t begin = 0, end = 0;                   // flat offsets
  const std::vector<int64_t>* counts = nullptr; // every group rank's share of it
  int64_t mine = 0;                             // this rank's share: flat offset ...
  int64_t shard_offset = 0;                     // ... where it sits in the shard ...
  int64_t size = 0;                             // ... and its elements
};

// Which of AdamW's arrays over a shard are the owned rows of the stage's
// whole buffers rather than shard-ordered arrays of their own
// (train/zero_shards.hpp says when).
struct ShardInStage {
  bool params = false;  // fp32 masters that are the stage's weights
  bool grads = false;   // gradients reduced in place in the stage's
  // ... and with `grads16` ([train] grad_dtype = bf16 at zero 1) the
  // blocks' in their 16-bit sums (StageLayout::sums_offset, chunks flagged
  // narrow), with `vocab16` the vocabulary's too (its gradients go
  // through the windows: StageLayout::windows_vocab), the others in the
  // stage's float gradients of the tensors outside the windows (at their
  // resident offsets).
  bool grads16 = false;
  bool vocab16 = false;
  bool copy = false;    // the 16-bit copy written into the stage's weights
};

class ShardPlan {
 public:
  // `ep`: the table's (StageRange::ep); it must divide dp.
  ShardPlan(const ParameterTable& table, const StageLayout& layout, int dp, int rank, int ep = 1);

  int dp() const { return dp_; }
  int rank() const { return rank_; }
  int ep() const { return ep_; }
  // The group a unit is cut over: its size and this rank's place in it.
  int group_size(const ShardUnit& u) const { return u.experts ? dp_ / ep_ : dp_; }
  int group_rank(const ShardUnit& u) const { return u.experts ? rank_ / ep_ : rank_; }
  const std::vector<ShardUnit>& units() const { return units_; }
  // Block i's units: [first, last) indices into units() (two for a sparse
  // block under expert parallelism: its dense tensors, then its experts).
  std::pair<size_t, size_t> block_units(int64_t i) const {
    return {block_first_[static_cast<size_t>(i)], block_first_[static_cast<size_t>(i) + 1]};
  }
  // f(WindowPart) for each unit's share in the window of block `id`, or of
  // a vocabulary use's piece (StageLayout::piece_id), in offset order.
  template <class F>
  void for_window(int64_t id, F&& f) const {
    if (id >= 0) {
      const auto [first, last] = block_units(id);
      for (size_t k = first; k < last; ++k) {
        const ShardUnit& u = units_[k];
        f(WindowPart{k, u.begin, u.end, &u.counts, part_begin(u), u.shard_offset, part_size(u)});
      }
      return;
    }
    const size_t use = StageLayout::piece_use(id) == StageLayout::kVocabIn ? 0 : 1;
    const auto k = static_cast<size_t>(StageLayout::piece_index(id));
    if (vocab_unit_[use] >= units_.size() || k >= pieces_[use].size())
      throw std::logic_error("ShardPlan: no such vocabulary piece on the stage");
    const ShardUnit& u = units_[vocab_unit_[use]];
    const Piece& p = pieces_[use][k];
    // This rank's part clipped to the piece (empty: at the part's edge).
    const int64_t lo = std::clamp(p.begin, part_begin(u), part_begin(u) + part_size(u));
    const int64_t hi = std::clamp(p.end, lo, part_begin(u) + part_size(u));
    f(WindowPart{vocab_unit_[use], p.begin, p.end, &p.counts, lo,
                 u.shard_offset + (lo - part_begin(u)), hi - lo});
  }
  // The unit holding flat offset `offset`'s tensor.
  const ShardUnit& unit_at(int64_t offset) const;
  int64_t part_begin(const ShardUnit& u) const { return u.cuts[group_rank(u)]; }
  int64_t part_size(const ShardUnit& u) const {
    return u.cuts[group_rank(u) + 1] - u.cuts[group_rank(u)];
  }
  // Every rank's part size of `u` (the collectives' counts).
  const std::vector<int64_t>& counts(const ShardUnit& u) const { return u.counts; }
  // Elements of this rank's shard; the largest any rank of the group has.
  int64_t shard_size() const { return shard_size_; }
  int64_t max_shard_size() const { return max_shard_size_; }
  // The most any rank owns of one block, all its units together (a receive
  // buffer for a block's sums).
  int64_t max_block_part() const { return max_block_part_; }
  // ... or of any window's, the vocabulary's too where it goes through
  // them (`vocab`: StageLayout::windows_vocab).
  int64_t max_window_part(bool vocab) const {
    return vocab ? std::max(max_block_part_, max_vocab_part_) : max_block_part_;
  }
  TensorPart part_of(const ParameterSpec& spec) const;
  // The most pieces a vocabulary use goes through the windows in at zero 3
  // (0: the stage has none, or none it could window).
  int64_t vocab_pieces() const {
    return static_cast<int64_t>(std::max(pieces_[0].size(), pieces_[1].size()));
  }
  // AdamW over the shard: every owned logical element, the moments at
  // shard offsets; each array flagged in `where` at the element's place in
  // the stage's whole buffer instead (its table offset), else at its shard
  // offset too.
  std::vector<AdamWChunk> adamw_chunks(const ParameterTable& table,
                                       ShardInStage where = ShardInStage{}) const;

 private:
  int dp_, rank_, ep_;
  StageLayout layout_;  // where the blocks are (the 16-bit sums' offsets)
  std::vector<ShardUnit> units_;
  std::vector<size_t> block_first_;  // blocks + 1 unit indices
  int64_t shard_size_ = 0, max_shard_size_ = 0, max_block_part_ = 0, max_vocab_part_ = 0;
  size_t vocab_unit_[2] = {SIZE_MAX, SIZE_MAX};  // the embedding's and the head's unit
  // Their pieces (StageLayout::piece): the flat span and every rank's share.
  struct Piece {
    int64_t begin = 0, end = 0;
    std::vector<int64_t> counts;
  };
  std::vector<Piece> pieces_[2];
};

}  // namespace mpiformer
