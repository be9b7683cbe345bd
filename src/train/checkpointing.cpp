#include "train/checkpointing.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/mpi_check.hpp"

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

// One tensor's rows, held by the ranks of `comm` in rank order, whole on
// `root` (for its checksum): a pointer to it there (this rank's own rows
// when the group is one rank; else a copy kept in `store`), null elsewhere.
const float* gather_tensor(MPI_Comm comm, int root, const float* rows, int64_t n_mine,
                           std::vector<float>& store) {
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  if (size == 1) return rows;
  const int mine = static_cast<int>(n_mine);
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  MPI_CHECK(MPI_Gather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += counts[r];
  }
  store.resize(rank == root ? static_cast<size_t>(total) : 0);
  MPI_CHECK(MPI_Gatherv(rows, mine, MPI_FLOAT, store.data(), counts.data(), displs.data(),
                        MPI_FLOAT, root, comm));
  return rank == root ? store.data() : nullptr;
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
                                            const StageState& state, ProcessGrid& grid) {
  const ParameterTable whole(cfg, StageRange{0, cfg.n_layer, true, true});
  std::vector<DatasetSlice> out;
  int tensor = 0;  // spreads the checksums' gathers over the group
  for (int g = 0; g < 3; ++g) {
    for (const auto& spec : whole.specs()) {
      DatasetSlice d;
      d.name = kGroups[g] + spec.name;
      d.shape = spec.shape;
      if (owner_stage(spec, cfg, grid.pp()) == grid.stage() && state.shards != nullptr) {
        // ZeRO: each owner writes its rows, so no byte is written twice.
        const ParameterSpec& mine = local.at(spec.name);
        const TensorPart p = state.shards->part_of(mine);
        const int64_t row_len = spec.numel() / spec.shape[0];
        d.row_begin = p.row_begin;
        d.row_end = p.row_end;
        d.rows = group_base(state, g) + p.shard_offset;
        const int root = tensor++ % grid.dp();
        std::vector<float> store;
        const float* all = gather_tensor(grid.data_parallel().get(), root, d.rows,
                                         (p.row_end - p.row_begin) * row_len, store);
        if (grid.dp_rank() == root) {
          d.reports_checksum = true;
          d.checksum = tensor_checksum(all, spec.numel());
        }
      } else if (owner_stage(spec, cfg, grid.pp()) == grid.stage()) {
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

int64_t restore_shard(const CheckpointReader& reader, const GptConfig& cfg,
                      const ParameterTable& local, const StageState& state, MPI_Comm group) {
  check_model(reader, cfg);
  const ShardPlan& plan = *state.shards;
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(group, &rank));
  MPI_CHECK(MPI_Comm_size(group, &size));
  for (int g = 0; g < 3; ++g) std::fill(group_base(state, g), group_base(state, g) + plan.shard_size(), 0.0f);
  // A read that fails or a checksum that does not hold may be found on one
  // rank only: it is reported after the loop, so no rank leaves the others
  // in a gather.
  std::string damaged, damaged_field;
  int tensor = 0;
  int64_t bytes = 0;
  std::vector<float> store;
  for (int g = 0; g < 3; ++g) {
    for (const auto& spec : local.specs()) {
      const TensorPart p = plan.part_of(spec);
      const int64_t row_len = spec.numel() / spec.shape[0];
      float* rows = group_base(state, g) + p.shard_offset;
      bytes += (p.row_end - p.row_begin) * row_len * static_cast<int64_t>(sizeof(float));
      // Each rank reads its own rows; a failure is kept for the end too (a
      // truncated file may fail some ranks' rows only).
      uint64_t stored = 0;
      try {
        stored = reader.read_rows(kGroups[g] + spec.name, spec.shape, p.row_begin, p.row_end, rows);
      } catch (const InputError& e) {
        if (damaged.empty()) {
          damaged_field = e.field();
          damaged = e.reason();
        }
      }
      const int root = tensor++ % size;
      const float* all = gather_tensor(group, root, rows, (p.row_end - p.row_begin) * row_len, store);
      if (rank != root || !damaged.empty()) continue;
      try {
        check_tensor_checksum(reader.path(), kGroups[g] + spec.name, stored, all, spec.numel());
      } catch (const InputError& e) {
        damaged_field = e.field();
        damaged = e.reason();
      }
    }
  }
  // The first rank that found damage names it to the group.
  int finder = damaged.empty() ? size : rank;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &finder, 1, MPI_INT, MPI_MIN, group));
  if (finder == size) return bytes;
  std::string field = damaged_field, reason = damaged;
  broadcast_string(group, field, finder);
  broadcast_string(group, reason, finder);
  throw InputError(reader.path(), field, reason);
}

int64_t restore_whole_stage(const CheckpointReader& reader, const GptConfig& cfg,
                            const ParameterTable& local, const StageRange& range,
                            const StageState& whole, MPI_Comm group) {
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(group, &size));
  MPI_CHECK(MPI_Comm_rank(group, &rank));
  const ShardPlan plan(local, StageLayout(local, range), size, rank);
  // One rank: its shard is the whole buffer, in order; read into it.
  if (size == 1) {
    return restore_shard(reader, cfg, local,
                         StageState{whole.params, whole.adam_m, whole.adam_v, &plan}, group);
  }
  const auto n = static_cast<size_t>(plan.shard_size());
  std::vector<float> p(n), m(n), v(n);
  const int64_t bytes = restore_shard(reader, cfg, local, StageState{p.data(), m.data(), v.data(), &plan}, group);
  gather_shards(plan, p.data(), whole.params, group);
  gather_shards(plan, m.data(), whole.adam_m, group);
  gather_shards(plan, v.data(), whole.adam_v, group);
  return bytes;
}

void gather_shards(const ShardPlan& plan, const float* shard, float* whole, MPI_Comm group) {
  std::vector<int> counts(static_cast<size_t>(plan.dp())), displs(counts.size());
  for (const ShardUnit& u : plan.units()) {
    for (int r = 0; r < plan.dp(); ++r) {
      counts[r] = static_cast<int>(u.cuts[r + 1] - u.cuts[r]);
      displs[r] = static_cast<int>(u.cuts[r] - u.begin);
    }
    MPI_CHECK(MPI_Allgatherv(shard + u.shard_offset, counts[plan.rank()], MPI_FLOAT, whole + u.begin,
                             counts.data(), displs.data(), MPI_FLOAT, group));
  }
}

}  // namespace mpiformer
