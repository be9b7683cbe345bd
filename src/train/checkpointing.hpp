// Between a pipeline stage's flat buffers and the checkpoint's logical
// tensors. Saving: which blocks of which tensors this rank writes (its
// stage's tensors: its tensor slice, rows split across the stage's
// replicas; replicated tensors by tensor rank 0). Restoring: each rank
// reads its slice's rows of its stage's tensors, whatever layout wrote them.
#pragma once
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "model/gpt_stage.hpp"
#include "model/shard_plan.hpp"
#include "parallel/process_grid.hpp"

namespace mpiformer {

// The three float buffers a checkpoint holds for one stage. On restore, null
// moment buffers are skipped (inference, and runs initialised from a
// checkpoint's weights, need the parameters only).
// Under ZeRO they are one rank's shard, cut as `shards` says (null: the
// stage's whole flat buffers), except the parameters when `params_whole`
// (fp32 at zero 1-2, whose masters are the stage's whole weights).
struct StageState {
  float* params;
  float* adam_m;
  float* adam_v;
  const ShardPlan* shards = nullptr;
  bool params_whole = false;
  // Where set (offloaded state read through views of its files), called
  // on each range once a pass of the save is done with it, so the save
  // holds a tensor's pages at a time, never the whole state.
  std::function<void(const float*, int64_t)> done_with = {};
  // A copy (a GPU's state downloaded) that training does not change: a
  // background save needs no snapshot of its own of these arrays.
  bool detached = false;
};
// How group g (0 params, 1 and 2 the moments) of `state` is laid out: its
// own shard plan, or none for whole buffers.
inline const ShardPlan* layout_of(const StageState& state, int g) {
  return g == 0 && state.params_whole ? nullptr : state.shards;
}

// Every dataset a checkpoint of model `cfg` holds, named and shaped from the
// schema: the parameters and both AdamW moments of every tensor.
struct CheckpointDataset {
  std::string name;  // "/model/wte", "/optim/adam_m/h.0.ln_1.weight", ...
  std::vector<int64_t> shape;
};
std::vector<CheckpointDataset> checkpoint_datasets(const GptConfig& cfg);

// Every dataset of the full model (same list on every rank), with this
// rank's blocks and, on the reporting rank, the checksum. A tensor every
// replica holds whole is summed by one of them, the replicas taking the
// tensors in turn by size, so the work is shared.
// Under ZeRO (state.shards) each owner lists its rows; under ZeRO or tensor
// parallelism each dataset's checksum is taken on one rank of the stage
// after a gather (collective over the stage's ranks).
std::vector<DatasetSlice> checkpoint_slices(const GptConfig& cfg, const ParameterTable& local,
                                            const StageState& state, ProcessGrid& grid);

// The elements a slice's rank writes, one after another at its data (0
// where it writes none).
inline int64_t slice_elements(const DatasetSlice& d) {
  if (d.data == nullptr) return 0;
  int64_t n = 0;
  for (const DatasetBox& b : d.boxes) n += b.rows * (d.shape.size() > 1 ? b.cols : 1);
  return n;
}

// Reads the tensors of `local` from `reader` into `state` (whole logical
// tensors; padding left zero). Throws InputError (file, dataset) on any
// mismatch, missing dataset or bad checksum.
void restore_stage(const CheckpointReader& reader, const GptConfig& cfg,
                   const ParameterTable& local, const StageState& state);
// The groups a stage's read runs over: its data-parallel replicas (the
// plan's dense units), the replicas holding its experts (the plan's expert
// units; the same ranks at ep 1), and for the checksums' gathers every
// rank of the stage and those of it holding the same experts.
struct ReadGroups {
  MPI_Comm dp, expert_dp, stage, expert_stage;
};
ReadGroups read_groups(ProcessGrid& grid);
// Reads only this rank's rows of each tensor slice (state.shards: a ZeRO
// shard, or a plan cut for the read) into its shard, so each byte of the
// file is read once per data-parallel group (and tensor rank), then checks
// every tensor's checksum on one rank of the stage (an expert's: of those
// holding it) after a gather. Collective over the stage; the same errors
// on every rank of it. Returns the bytes this rank read.
int64_t restore_shard(const CheckpointReader& reader, const GptConfig& cfg,
                      const ParameterTable& local, const StageState& state,
                      const ReadGroups& groups);
// The whole flat buffer on every rank of the data-parallel group from each
// rank's shard (expert units over the replicas holding them).
// `done_with` (where set) is called on each unit of `whole` once gathered.
void gather_shards(const ShardPlan& plan, const float* shard, float* whole,
                   const ReadGroups& groups,
                   const std::function<void(const float*, int64_t)>& done_with = {});
// zero 0: every rank of its data-parallel group holds the whole stage
// (slice); each reads its rows of a plan cut over the group (restore_shard),
// then the group gathers them into `whole`. Returns the bytes this rank read.
int64_t restore_whole_stage(const CheckpointReader& reader, const GptConfig& cfg,
                            const ParameterTable& local, const StageRange& range,
                            const StageState& whole, const ReadGroups& groups);

// [train] grad_compression's residuals (train/compressed_allreduce.hpp):
// per rank, not logical tensors, so one dataset per rank that holds some,
// /grad_compression/rank<R> (R its world rank), written and checksummed by
// that rank. Collective over `world` (every rank lists every dataset).
// `residual` must outlive the write.
std::vector<DatasetSlice> compression_slices(const std::vector<float>& residual, MPI_Comm world);
// This rank's residuals from `reader` into `residual` (its size: what the
// run holds) where the checkpoint was written by this layout (dp, pp, tp,
// ranks) and holds them, on every rank: true; false on every rank where
// any rank's are absent or of another size (the run then starts them at
// zero). A dataset that fails its checksum is an InputError.
bool restore_compression(const CheckpointReader& reader, int dp, int pp, int tp, MPI_Comm world,
                         std::vector<float>& residual);

}  // namespace mpiformer
