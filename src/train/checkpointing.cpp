#include "train/checkpointing.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/format.hpp"

namespace mpiformer {
namespace {

const char* const kGroups[3] = {"/model/", "/optim/adam_m/", "/optim/adam_v/"};

float* group_base(const StageState& s, int g) {
  return g == 0 ? s.params : g == 1 ? s.adam_m : s.adam_v;
}

// The stage that writes a tensor: the first stage for the embedding tables
// (wte's copy on the last stage is tied to it), the last stage for the final
// LayerNorm, the stage holding the block for a block's tensors.
int owner_stage(const ParameterSpec& spec, const GptConfig& cfg, int pp) {
  if (spec.layer < 0) return spec.schema().placement == Placement::kFirstStage ? 0 : pp - 1;
  for (int s = 0; s < pp; ++s) {
    const StageRange r = partition_stage(cfg, s, pp);
    if (spec.layer >= r.first_layer && spec.layer < r.last_layer) return s;
  }
  throw std::logic_error("no stage holds " + spec.name);
}

void check_model(const CheckpointReader& reader, const GptConfig& cfg) {
  const CheckpointMeta& m = reader.meta();
  const std::pair<const char*, std::pair<int64_t, int64_t>> keys[] = {
      {"n_layer", {m.n_layer, cfg.n_layer}}, {"n_head", {m.n_head, cfg.n_head}},
      {"n_embd", {m.n_embd, cfg.n_embd}},    {"seq_len", {m.seq_len, cfg.seq_len}},
      {"vocab_size", {m.vocab_size, cfg.vocab_size}}};
  for (const auto& [key, v] : keys) {
    if (v.first != v.second) {
      throw InputError(reader.path(), std::string("[model] ") + key,
                       strprintf("the checkpoint's model has %lld, the deck %lld (the model's shape "
                                 "cannot change on resume)",
                                 static_cast<long long>(v.first), static_cast<long long>(v.second)));
    }
  }
}

}  // namespace

std::vector<CheckpointDataset> checkpoint_datasets(const GptConfig& cfg) {
  const ParameterTable whole(cfg, StageRange{0, cfg.n_layer, true, true});
  std::vector<CheckpointDataset> out;
  for (int g = 0; g < 3; ++g)
    for (const auto& spec : whole.specs()) out.push_back({kGroups[g] + spec.name, spec.shape});
  return out;
}

std::vector<DatasetSlice> checkpoint_slices(const GptConfig& cfg, const ParameterTable& local,
                                            const StageState& state, const ProcessGrid& grid) {
  const ParameterTable whole(cfg, StageRange{0, cfg.n_layer, true, true});
  std::vector<DatasetSlice> out;
  for (int g = 0; g < 3; ++g) {
    for (const auto& spec : whole.specs()) {
      DatasetSlice d;
      d.name = kGroups[g] + spec.name;
      d.shape = spec.shape;
      if (owner_stage(spec, cfg, grid.pp()) == grid.stage()) {
        const ParameterSpec& mine = local.at(spec.name);
        const float* base = group_base(state, g) + mine.offset;
        // Rows split across the stage's replicas so all of them write.
        const int64_t rows = spec.shape[0], row_len = spec.numel() / rows;
        const int64_t block = (rows + grid.dp() - 1) / grid.dp();
        d.row_begin = std::min(rows, grid.dp_rank() * block);
        d.row_end = std::min(rows, d.row_begin + block);
        d.rows = base + d.row_begin * row_len;
        if (grid.dp_rank() == 0) {
          d.reports_checksum = true;
          d.checksum = tensor_checksum(base, spec.numel());
        }
      }
      out.push_back(std::move(d));
    }
  }
  return out;
}

void restore_stage(const CheckpointReader& reader, const GptConfig& cfg,
                   const ParameterTable& local, const StageState& state) {
  check_model(reader, cfg);
  for (int g = 0; g < 3; ++g) {
    if (group_base(state, g) == nullptr) continue;
    for (const auto& spec : local.specs()) {
      float* base = group_base(state, g) + spec.offset;
      std::fill(base, base + spec.storage, 0.0f);
      reader.read(kGroups[g] + spec.name, spec.shape, base);
    }
  }
}

}  // namespace mpiformer
