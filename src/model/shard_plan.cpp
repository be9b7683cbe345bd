#include "model/shard_plan.hpp"

#include <algorithm>
#include <stdexcept>

namespace mpiformer {
namespace {

// The first row boundary at or after `target` within [begin, end) of the
// unit whose tensors are `specs` (in offset order).
int64_t snap_to_row(const std::vector<const ParameterSpec*>& specs, int64_t target, int64_t end) {
  // The tensor holding `target` (specs in offset order): the last that
  // starts at or before it (a planner's search cuts every unit dp ways).
  const auto after = std::upper_bound(specs.begin(), specs.end(), target,
                                      [](int64_t t, const ParameterSpec* s) { return t < s->offset; });
  for (size_t k = after == specs.begin() ? 0 : static_cast<size_t>(after - specs.begin()) - 1;
       k < specs.size(); ++k) {
    const ParameterSpec& s = *specs[k];
    const int64_t next = k + 1 < specs.size() ? specs[k + 1]->offset : end;
    if (target >= next) continue;
    if (target <= s.offset) return s.offset;
    // Rows of the stored tensor (wte's padding rows too, all zeros); the
    // alignment gap after the tensor goes with the next one.
    const int64_t rl = s.row_length(), stored = s.offset + s.storage;
    if (target >= stored) return next;
    return std::min(stored, s.offset + (target - s.offset + rl - 1) / rl * rl);
  }
  return end;
}

}  // namespace

ShardPlan::ShardPlan(const ParameterTable& table, const StageLayout& layout, int dp, int rank,
                     int ep)
    : dp_(dp), rank_(rank), ep_(ep), layout_(layout) {
  if (ep < 1 || dp % ep != 0) throw std::invalid_argument("ShardPlan: ep must divide dp");
  // Units in offset order: the tensors before the blocks one by one, each
  // block (its experts apart under ep > 1), the tensors after them one by one.
  std::vector<const ParameterSpec*> specs;
  for (const auto& s : table.specs()) specs.push_back(&s);
  std::sort(specs.begin(), specs.end(),
            [](const ParameterSpec* a, const ParameterSpec* b) { return a->offset < b->offset; });
  std::vector<std::pair<ShardUnit, std::vector<const ParameterSpec*>>> units;
  for (size_t k = 0; k < specs.size(); ++k) {
    const ParameterSpec& s = *specs[k];
    const int64_t next = k + 1 < specs.size() ? specs[k + 1]->offset : table.total_storage();
    const int64_t block = s.layer < 0 ? -1 : layout.block_at_offset(s.offset);
    const bool experts = ep > 1 && s.expert >= 0;
    if (s.layer >= 0 && !units.empty() && units.back().first.block == block &&
        units.back().first.experts == experts) {
      units.back().first.end = next;
      units.back().second.push_back(&s);
      continue;
    }
    ShardUnit u;
    u.begin = s.offset;
    u.end = next;
    u.block = block;
    u.experts = experts;
    units.push_back({u, {&s}});
  }
  // Each dp rank's shard size: part r of the dense units, part r / ep of
  // the experts'.
  std::vector<int64_t> sizes(static_cast<size_t>(dp), 0);
  std::vector<int64_t> block_part(static_cast<size_t>(dp), 0);
  int64_t last_block = -1;
  for (auto& [u, members] : units) {
    const int g = group_size(u);
    u.cuts.assign(static_cast<size_t>(g) + 1, u.begin);
    for (int r = 1; r < g; ++r) {
      const int64_t target = u.begin + (u.end - u.begin) * r / g;
      u.cuts[r] = std::max(u.cuts[r - 1], snap_to_row(members, target, u.end));
    }
    u.cuts[g] = u.end;
    u.counts.reserve(static_cast<size_t>(g));
    for (int r = 0; r < g; ++r) u.counts.push_back(u.cuts[r + 1] - u.cuts[r]);
    u.shard_offset = sizes[rank];
    if (u.block != last_block) std::fill(block_part.begin(), block_part.end(), 0);
    for (int r = 0; r < dp; ++r) {
      const int64_t part = u.counts[static_cast<size_t>(u.experts ? r / ep : r)];
      sizes[r] += part;
      if (u.block < 0) continue;
      block_part[r] += part;
      max_block_part_ = std::max(max_block_part_, block_part[r]);
    }
    if (u.block >= 0 && u.block != last_block) block_first_.push_back(units_.size());
    last_block = u.block;
    units_.push_back(std::move(u));
  }
  // The blocks' units are consecutive: block i's end where block i + 1's begin.
  size_t end = block_first_.empty() ? 0 : block_first_.back();
  while (end < units_.size() && units_[end].block >= 0) ++end;
  block_first_.push_back(end);
  for (size_t k = 0; k < units_.size(); ++k) {
    const ShardUnit& u = units_[k];
    if (u.begin == layout.vocab_in.begin) vocab_unit_[0] = k;
    if (u.begin == layout.vocab_out.begin) vocab_unit_[1] = k;
  }
  // The vocabulary's pieces: each rank's share of one is where its part
  // and the piece overlap (parts and pieces are runs of whole rows).
  for (int use = 0; use < 2; ++use) {
    if (vocab_unit_[use] >= units_.size() || !layout.windows_vocab(true)) continue;
    const ShardUnit& u = units_[vocab_unit_[use]];
    const int64_t id = use == 0 ? StageLayout::kVocabIn : StageLayout::kVocabOut;
    for (int64_t k = 0; k < layout.vocab_pieces(id); ++k) {
      const StageLayout::Span sp = layout.piece(StageLayout::piece_id(id, k));
      Piece p{sp.begin, sp.end, {}};
      for (size_t r = 0; r + 1 < u.cuts.size(); ++r) {
        const int64_t lo = std::clamp(u.cuts[r], p.begin, p.end);
        p.counts.push_back(std::clamp(u.cuts[r + 1], p.begin, p.end) - lo);
      }
      max_vocab_part_ =
          std::max(max_vocab_part_, *std::max_element(p.counts.begin(), p.counts.end()));
      pieces_[use].push_back(std::move(p));
    }
  }
  shard_size_ = sizes[rank];
  max_shard_size_ = *std::max_element(sizes.begin(), sizes.end());
}

const ShardUnit& ShardPlan::unit_at(int64_t offset) const {
  for (const auto& u : units_)
    if (offset >= u.begin && offset < u.end) return u;
  throw std::out_of_range("ShardPlan: no unit holds offset " + std::to_string(offset));
}

TensorPart ShardPlan::part_of(const ParameterSpec& spec) const {
  const ShardUnit& u = unit_at(spec.offset);
  const int64_t rl = spec.row_length();
  // Clipped to the logical tensor: rows past numel are wte's padding.
  const int r = group_rank(u);
  const int64_t lo = std::clamp(u.cuts[r], spec.offset, spec.offset + spec.numel());
  const int64_t hi = std::clamp(u.cuts[r + 1], spec.offset, spec.offset + spec.numel());
  TensorPart p;
  p.row_begin = (lo - spec.offset) / rl;
  p.row_end = std::max(p.row_begin, (hi - spec.offset) / rl);
  p.shard_offset = u.shard_offset + (lo - u.cuts[r]);
  return p;
}

std::vector<AdamWChunk> ShardPlan::adamw_chunks(const ParameterTable& table, ShardInStage where) const {
  std::vector<AdamWChunk> chunks;
  for (const auto& s : table.specs()) {
    const TensorPart p = part_of(s);
    const int64_t rl = s.row_length();
    const int64_t shard = p.shard_offset, stage = s.offset + p.row_begin * rl;
    int64_t grad = where.grads ? stage : shard;
    bool narrow = false;
    if (where.grads16) {
      narrow = unit_at(s.offset).block >= 0 || (where.vocab16 && layout_.is_vocab(s.offset));
      grad = narrow ? layout_.sums_offset(stage, where.vocab16)
                    : layout_.resident_offset(stage, true, where.vocab16);
    }
    append_adamw_chunks(chunks,
                        AdamWPlaces{shard, where.params ? stage : shard, grad,
                                    where.copy ? stage : shard},
                        (p.row_end - p.row_begin) * rl, s.decay, narrow);
  }
  return chunks;
}

}  // namespace mpiformer
