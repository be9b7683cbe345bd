#include "train/checkpointing.hpp"

#include <algorithm>
#include <unordered_map>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/mpi_check.hpp"
#include "host/parallel.hpp"

namespace mpiformer {
namespace {

const char* const kGroups[3] = {"/model/", "/optim/adam_m/", "/optim/adam_v/"};

float* group_base(const StageState& s, int g) {
  return g == 0 ? s.params : g == 1 ? s.adam_m : s.adam_v;
}

// Whether this stage writes a tensor: the first stage the embedding
// tables (wte's copy on the last stage is tied to it), the last stage the
// final LayerNorm, the stage holding the block (whichever chunk, its
// layer in `held_layers`) a block's tensors; an expert's on some of the
// stage's ranks.
bool writes(const ParameterSpec& spec, const std::vector<bool>& held_layers,
            const ProcessGrid& grid) {
  if (spec.layer >= 0) return held_layers[static_cast<size_t>(spec.layer)];
  return spec.schema().placement == Placement::kFirstStage ? grid.first_stage() : grid.last_stage();
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
  // The family after the shape: a shape that differs is named by its key.
  const GptConfig saved = model_config(m);
  if (saved.family != cfg.family || saved.kv_heads() != cfg.kv_heads() || saved.ffn() != cfg.ffn() ||
      saved.tie_embeddings != cfg.tie_embeddings || saved.rope_theta != cfg.rope_theta ||
      saved.norm_eps != cfg.norm_eps) {
    throw InputError(reader.path(),
                     "[model] family, n_kv_head, ffn_hidden, tie_embeddings, rope_theta, norm_eps",
                     strprintf("the checkpoint holds a %s model (n_kv_head %lld, ffn_hidden %lld, "
                               "tie_embeddings %s, rope_theta %g, norm_eps %g) that the deck's "
                               "differs from (the model cannot change on resume)",
                               saved.llama() ? "llama" : "gpt2",
                               static_cast<long long>(saved.kv_heads()),
                               static_cast<long long>(saved.ffn()),
                               saved.tie_embeddings ? "true" : "false", saved.rope_theta,
                               saved.norm_eps));
  }
  // The experts' tensors and the function they compute: capacity_factor
  // and the losses' weights are training choices a resume may change.
  if (saved.experts != cfg.experts || (saved.moe() && (saved.top_k != cfg.top_k ||
                                                       saved.moe_every != cfg.moe_every))) {
    throw InputError(reader.path(), "[model] experts, top_k, moe_every",
                     strprintf("the checkpoint holds a model of %lld experts (top_k %lld, "
                               "moe_every %lld) that the deck's differs from (the model cannot "
                               "change on resume)",
                               static_cast<long long>(saved.experts),
                               static_cast<long long>(saved.top_k),
                               static_cast<long long>(saved.moe_every)));
  }
}

std::vector<DatasetBox> dataset_boxes(const std::vector<LogicalBox>& boxes) {
  std::vector<DatasetBox> out;
  for (const LogicalBox& b : boxes) out.push_back({b.row, b.rows, b.col, b.cols});
  return out;
}

int64_t elements(const std::vector<DatasetBox>& boxes) {
  int64_t n = 0;
  for (const DatasetBox& b : boxes) n += b.rows * b.cols;
  return n;
}

// One tensor whole on `root` of `comm` (for its checksum), from the blocks
// each rank holds (`boxes`, elements one after another at `data`; ranks
// with none send nothing): a pointer to it there, null elsewhere. Blocks
// that are whole rows in increasing order (rows split over replicas) are
// the tensor as gathered; others (tensor-parallel slices) are put in order
// in `assembled`.
const float* gather_tensor(MPI_Comm comm, int root, const std::vector<int64_t>& shape,
                           const std::vector<DatasetBox>& boxes, const float* data,
                           std::vector<float>& store, std::vector<float>& assembled) {
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  constexpr int kMaxBoxes = 3;  // a qkv slice's q, k and v
  MPIFORMER_CHECK(boxes.size() <= kMaxBoxes, "a tensor slice of more than three blocks");
  int64_t mine[4 * kMaxBoxes] = {};
  for (size_t i = 0; i < boxes.size(); ++i) {
    mine[4 * i] = boxes[i].row;
    mine[4 * i + 1] = boxes[i].rows;
    mine[4 * i + 2] = boxes[i].col;
    mine[4 * i + 3] = boxes[i].cols;
  }
  std::vector<int64_t> all(static_cast<size_t>(4 * kMaxBoxes) * (rank == root ? size : 0));
  const int64_t width = shape.size() > 1 ? shape[1] : 1;
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  const float* gathered = data;
  if (size > 1) {
    MPI_CHECK(MPI_Gather(mine, 4 * kMaxBoxes, MPI_INT64_T, all.data(), 4 * kMaxBoxes, MPI_INT64_T,
                         root, comm));
    const int n_mine = static_cast<int>(elements(boxes));
    std::vector<int> counts(static_cast<size_t>(size)), displs(counts.size());
    MPI_CHECK(MPI_Gather(&n_mine, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm));
    int at = 0;
    for (int r = 0; r < size && rank == root; ++r) {
      displs[r] = at;
      at += counts[r];
    }
    store.resize(rank == root ? static_cast<size_t>(at) : 0);
    MPI_CHECK(MPI_Gatherv(data, n_mine, MPI_FLOAT, store.data(), counts.data(), displs.data(),
                          MPI_FLOAT, root, comm));
    gathered = store.data();
  } else {
    all.assign(mine, mine + 4 * kMaxBoxes);
  }
  if (rank != root) return nullptr;
  // In order already: whole rows, each block starting where the last ended.
  bool in_order = true;
  int64_t next_row = 0, seen = 0;
  for (size_t i = 0; i + 4 <= all.size(); i += 4) {
    if (all[i + 1] <= 0) continue;
    in_order = in_order && all[i] == next_row && all[i + 2] == 0 && all[i + 3] == width;
    next_row = all[i] + all[i + 1];
    seen += all[i + 1] * all[i + 3];
  }
  MPIFORMER_CHECK(seen == total, "the blocks gathered for a checksum do not make the tensor");
  if (in_order) return gathered;
  assembled.resize(static_cast<size_t>(total));
  const float* from = gathered;
  for (size_t i = 0; i + 4 <= all.size(); i += 4) {
    for (int64_t r = 0; r < all[i + 1]; ++r, from += all[i + 3])
      std::copy_n(from, all[i + 3], assembled.data() + (all[i] + r) * width + all[i + 2]);
  }
  return assembled.data();
}

// The rows of its slice of `spec` a rank of a stage writes or reads as its
// share: its ZeRO part, or (zero 0) its block of rows split over the
// replicas; replicated tensors are left to tensor rank 0.
struct Share {
  int64_t row_begin = 0, row_end = 0;
  int64_t offset = 0;  // of row_begin, in the state's buffers
};
Share share_of(const ParameterSpec& mine, const ShardPlan* shards, int dp, int dp_rank) {
  Share sh;
  if (shards != nullptr) {
    const TensorPart p = shards->part_of(mine);
    sh = {p.row_begin, p.row_end, p.shard_offset};
  } else {
    const int64_t rows = mine.shape[0];
    const int64_t block = (rows + dp - 1) / dp;
    sh.row_begin = std::min(rows, dp_rank * block);
    sh.row_end = std::min(rows, sh.row_begin + block);
    sh.offset = mine.offset + sh.row_begin * mine.row_length();
  }
  if (!mine.whole() || mine.tp_rank == 0) return sh;
  sh.row_end = sh.row_begin;
  return sh;
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
  MPI_Comm stage_group = grid.stage_group().get();
  const int stage_size = grid.dp() * grid.tp();
  // Looked up once per tensor of the whole model (thousands with experts).
  std::vector<bool> held_layers(static_cast<size_t>(cfg.n_layer), false);
  std::unordered_map<std::string, const ParameterSpec*> by_name;
  for (const auto& s : local.specs()) {
    if (s.layer >= 0) held_layers[static_cast<size_t>(s.layer)] = true;
    by_name.emplace(s.name, &s);
  }
  int tensor = 0;  // spreads the checksums' gathers over the stage's ranks
  // Elements each replica sums of the tensors all hold whole: each such
  // tensor goes to the least loaded (the same choice on every replica).
  std::vector<int64_t> summed(static_cast<size_t>(std::max(grid.dp(), 1)), 0);
  struct LocalSum {
    size_t slice;
    const float* data;
    int64_t n;
  };
  std::vector<LocalSum> local_sums;
  for (int g = 0; g < 3; ++g) {
    for (const auto& spec : whole.specs()) {
      DatasetSlice d;
      d.name = kGroups[g] + spec.name;
      d.shape = spec.shape;
      if (writes(spec, held_layers, grid)) {
        // Every rank of the stage holding it writes its share, so no byte
        // is written twice and all of them write. An expert is held by the
        // replicas ep apart (expert parallelism; `held` null on the others,
        // which still join the checksum's gather).
        const auto found = by_name.find(spec.name);
        const ParameterSpec* held = found == by_name.end() ? nullptr : found->second;
        const bool expert = spec.expert >= 0;
        const int holders = expert ? grid.dp() / grid.ep() : grid.dp();
        const int holder = expert ? grid.dp_rank() / grid.ep() : grid.dp_rank();
        const ShardPlan* shards = layout_of(state, g);
        if (held != nullptr) {
          const Share sh = share_of(*held, shards, holders, holder);
          // A kv head shared by tensor ranks: written by the first of them.
          d.boxes = dataset_boxes(held->owned_boxes(sh.row_begin, sh.row_end));
          d.data = group_base(state, g) + sh.offset;
          if (state.done_with) {
            const float* data = d.data;
            const int64_t count = elements(d.boxes);
            d.written = [done = state.done_with, data, count] { done(data, count); };
          }
        }
        const bool whole_slice = grid.tp() == 1 || spec.schema().split == Split::kNone;
        if (shards == nullptr && whole_slice) {
          // Every replica holding it holds it whole: no gather.
          const auto least = std::min_element(summed.begin(), summed.begin() + holders);
          const int reporter = static_cast<int>(least - summed.begin());
          *least += spec.numel();
          if (held != nullptr && holder == reporter && grid.tp_rank() == 0) {
            d.reports_checksum = true;
            const float* whole = group_base(state, g) + held->offset;
            if (state.done_with) {
              d.checksum = tensor_checksum(whole, spec.numel());
              state.done_with(whole, spec.numel());
            } else {
              local_sums.push_back({out.size(), whole, spec.numel()});
            }
          }
        } else {
          const int root = tensor++ % stage_size;
          std::vector<float> store, assembled;
          const float* all =
              gather_tensor(stage_group, root, spec.shape, d.boxes, d.data, store, assembled);
          if (grid.stage_group().rank() == root) {
            d.reports_checksum = true;
            d.checksum = tensor_checksum(all, spec.numel());
          }
          if (held != nullptr && state.done_with) state.done_with(d.data, elements(d.boxes));
        }
      }
      out.push_back(std::move(d));
    }
  }
  // State in memory: the whole tensors' checksums by the rank's threads
  // (offloaded views were summed one at a time above, each dropped after).
  const LocalSum* jobs = local_sums.data();
  DatasetSlice* slices = out.data();
  host::parallel_for("checkpoint_checksums", static_cast<int64_t>(local_sums.size()),
                     [=](const int64_t i) {
                       slices[jobs[i].slice].checksum = tensor_checksum(jobs[i].data, jobs[i].n);
                     });
  return out;
}

void restore_stage(const CheckpointReader& reader, const GptConfig& cfg,
                   const ParameterTable& local, const StageState& state) {
  check_model(reader, cfg);
  for (int g = 0; g < 3; ++g) {
    if (group_base(state, g) == nullptr) continue;
    for (const auto& spec : local.specs()) {
      if (!spec.whole()) throw std::logic_error("restore_stage: a tensor-parallel slice");
      float* base = group_base(state, g) + spec.offset;
      std::fill(base, base + spec.storage, 0.0f);
      reader.read(kGroups[g] + spec.name, spec.shape, base);
    }
  }
}

ReadGroups read_groups(ProcessGrid& grid) {
  return ReadGroups{grid.data_parallel().get(), grid.expert_data_parallel().get(),
                    grid.stage_group().get(), grid.same_tensors().get()};
}

int64_t restore_shard(const CheckpointReader& reader, const GptConfig& cfg,
                      const ParameterTable& local, const StageState& state,
                      const ReadGroups& groups) {
  check_model(reader, cfg);
  const ShardPlan& plan = *state.shards;
  MPI_Comm stage_group = groups.stage;
  int rank = 0, size = 0, expert_rank = 0, expert_size = 0;
  MPI_CHECK(MPI_Comm_rank(stage_group, &rank));
  MPI_CHECK(MPI_Comm_size(stage_group, &size));
  MPI_CHECK(MPI_Comm_rank(groups.expert_stage, &expert_rank));
  MPI_CHECK(MPI_Comm_size(groups.expert_stage, &expert_size));
  // Null moments are not read (a run initialised from the weights alone).
  // Zeroed in pieces, each one's pages dropped after it where they are a
  // view of offloaded state (done_with).
  for (int g = 0; g < 3; ++g) {
    float* base = group_base(state, g);
    if (base == nullptr) continue;
    constexpr int64_t kPiece = int64_t{1} << 22;
    for (int64_t at = 0; at < plan.shard_size(); at += kPiece) {
      const int64_t len = std::min(kPiece, plan.shard_size() - at);
      std::fill(base + at, base + at + len, 0.0f);
      if (state.done_with) state.done_with(base + at, len);
    }
  }
  // A read that fails or a checksum that does not hold may be found on one
  // rank only: it is reported after the loop, so no rank leaves the others
  // in a gather.
  std::string damaged, damaged_field;
  int tensor = 0, expert_tensor = 0;
  int64_t bytes = 0;
  std::vector<float> store, assembled;
  for (int g = 0; g < 3; ++g) {
    if (group_base(state, g) == nullptr) continue;
    for (const auto& spec : local.specs()) {
      const TensorPart p = plan.part_of(spec);
      const std::vector<DatasetBox> boxes = dataset_boxes(spec.boxes(p.row_begin, p.row_end));
      float* rows = group_base(state, g) + p.shard_offset;
      bytes += elements(boxes) * static_cast<int64_t>(sizeof(float));
      // Each rank reads its own rows; a failure is kept for the end too (a
      // truncated file may fail some ranks' rows only).
      uint64_t stored = 0;
      try {
        stored = reader.read_boxes(kGroups[g] + spec.name, spec.logical_shape, boxes, rows);
      } catch (const InputError& e) {
        if (damaged.empty()) {
          damaged_field = e.field();
          damaged = e.reason();
        }
      }
      // The checksum over the whole tensor, from every rank's blocks; a
      // replicated tensor's copies are the same bytes of the file: tensor
      // rank 0's are checked (a shared kv head's: its first rank's). An
      // expert's blocks are the ranks' holding it (its plan unit's group).
      const bool expert = plan.unit_at(spec.offset).experts;
      const int root = expert ? expert_tensor++ % expert_size : tensor++ % size;
      const bool counts = spec.whole() ? spec.tp_rank == 0 : true;
      const float* all = gather_tensor(
          expert ? groups.expert_stage : stage_group, root, spec.logical_shape,
          counts ? dataset_boxes(spec.owned_boxes(p.row_begin, p.row_end)) : std::vector<DatasetBox>{},
          rows, store, assembled);
      if (state.done_with) state.done_with(rows, (p.row_end - p.row_begin) * spec.row_length());
      if ((expert ? expert_rank : rank) != root || !damaged.empty()) continue;
      try {
        check_tensor_checksum(reader.path(), kGroups[g] + spec.name, stored, all,
                              spec.logical_numel());
      } catch (const InputError& e) {
        damaged_field = e.field();
        damaged = e.reason();
      }
    }
  }
  // The first rank that found damage names it to the stage.
  int finder = damaged.empty() ? size : rank;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &finder, 1, MPI_INT, MPI_MIN, stage_group));
  if (finder == size) return bytes;
  std::string field = damaged_field, reason = damaged;
  broadcast_string(stage_group, field, finder);
  broadcast_string(stage_group, reason, finder);
  throw InputError(reader.path(), field, reason);
}

int64_t restore_whole_stage(const CheckpointReader& reader, const GptConfig& cfg,
                            const ParameterTable& local, const StageRange& range,
                            const StageState& whole, const ReadGroups& groups) {
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(groups.dp, &size));
  MPI_CHECK(MPI_Comm_rank(groups.dp, &rank));
  const ShardPlan plan(local, StageLayout(local, range), size, rank, static_cast<int>(range.ep));
  // One replica: its shard is the whole buffer, in order; read into it.
  if (size == 1) {
    return restore_shard(reader, cfg, local,
                         StageState{whole.params, whole.adam_m, whole.adam_v, &plan, false,
                                    whole.done_with},
                         groups);
  }
  // Group by group through one shard-sized buffer (the masters, then each
  // moment), each gathered unit by unit into the whole stage.
  std::vector<float> shard(static_cast<size_t>(plan.shard_size()));
  int64_t bytes = 0;
  for (int g = 0; g < 3; ++g) {
    float* dst = group_base(whole, g);
    if (dst == nullptr) continue;
    StageState one{nullptr, nullptr, nullptr, &plan};
    (g == 0 ? one.params : g == 1 ? one.adam_m : one.adam_v) = shard.data();
    bytes += restore_shard(reader, cfg, local, one, groups);
    gather_shards(plan, shard.data(), dst, groups, whole.done_with);
  }
  return bytes;
}

void gather_shards(const ShardPlan& plan, const float* shard, float* whole,
                   const ReadGroups& groups,
                   const std::function<void(const float*, int64_t)>& done_with) {
  std::vector<int> counts, displs;
  for (const ShardUnit& u : plan.units()) {
    counts.resize(static_cast<size_t>(plan.group_size(u)));
    displs.resize(counts.size());
    for (int r = 0; r < plan.group_size(u); ++r) {
      counts[r] = static_cast<int>(u.cuts[r + 1] - u.cuts[r]);
      displs[r] = static_cast<int>(u.cuts[r] - u.begin);
    }
    MPI_CHECK(MPI_Allgatherv(shard + u.shard_offset, counts[plan.group_rank(u)], MPI_FLOAT,
                             whole + u.begin, counts.data(), displs.data(), MPI_FLOAT,
                             u.experts ? groups.expert_dp : groups.dp));
    if (done_with) done_with(whole + u.begin, u.end - u.begin);
  }
}

namespace {
std::string compression_dataset(int rank) { return "/grad_compression/rank" + std::to_string(rank); }
}  // namespace

std::vector<DatasetSlice> compression_slices(const std::vector<float>& residual, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  int64_t mine = static_cast<int64_t>(residual.size());
  std::vector<int64_t> sizes(static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, world));
  std::vector<DatasetSlice> out;
  for (int r = 0; r < size; ++r) {
    if (sizes[static_cast<size_t>(r)] == 0) continue;
    DatasetSlice d;
    d.name = compression_dataset(r);
    d.shape = {sizes[static_cast<size_t>(r)]};
    if (r == rank) {
      d.boxes = {DatasetBox{0, mine, 0, 1}};
      d.data = residual.data();
      d.reports_checksum = true;
      d.checksum = tensor_checksum(residual.data(), mine);
    }
    out.push_back(std::move(d));
  }
  return out;
}

bool restore_compression(const CheckpointReader& reader, int dp, int pp, int tp, MPI_Comm world,
                         std::vector<float>& residual) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  const CheckpointMeta& m = reader.meta();
  // dp: the stage's replicas (dp x cp).
  int here = m.dp * m.cp == dp && m.pp == pp && m.tp == tp && m.world_size == size ? 1 : 0;
  const std::string name = compression_dataset(rank);
  const std::vector<int64_t> shape{static_cast<int64_t>(residual.size())};
  if (here != 0 && !residual.empty()) {
    here = 0;
    for (const auto& [n, dims] : reader.datasets())
      if (n == name && dims == shape) here = 1;
  }
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &here, 1, MPI_INT, MPI_MIN, world));
  if (here == 0) return false;
  if (!residual.empty()) reader.read(name, shape, residual.data());
  return true;
}

}  // namespace mpiformer
