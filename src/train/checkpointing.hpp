// Between a pipeline stage's flat buffers and the checkpoint's logical
// tensors. Saving: which rows of which tensors this rank writes (its stage's
// tensors, rows split across the stage's replicas). Restoring: each rank
// reads the whole tensors its stage holds, whatever layout wrote them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "model/gpt_stage.hpp"
#include "model/shard_plan.hpp"
#include "parallel/process_grid.hpp"

namespace mpiformer {

// The three float buffers a checkpoint holds for one stage. On restore, null
// moment buffers are skipped (inference needs the parameters only).
// Under ZeRO they are one rank's shard, cut as `shards` says (null: the
// stage's whole flat buffers).
struct StageState {
  float* params;
  float* adam_m;
  float* adam_v;
  const ShardPlan* shards = nullptr;
};

// Every dataset a checkpoint of model `cfg` holds, named and shaped from the
// schema: the parameters and both AdamW moments of every tensor.
struct CheckpointDataset {
  std::string name;  // "/model/wte", "/optim/adam_m/h.0.ln_1.weight", ...
  std::vector<int64_t> shape;
};
std::vector<CheckpointDataset> checkpoint_datasets(const GptConfig& cfg);

// Every dataset of the full model (same list on every rank), with this
// rank's rows and, on the reporting rank, the checksum.
// Under ZeRO (state.shards) each owner lists its rows, and each dataset's
// checksum is taken on one rank of the group after a gather (collective
// over the data-parallel group).
std::vector<DatasetSlice> checkpoint_slices(const GptConfig& cfg, const ParameterTable& local,
                                            const StageState& state, ProcessGrid& grid);

// Reads the tensors of `local` from `reader` into `state` (whole logical
// tensors; padding left zero). Throws InputError (file, dataset) on any
// mismatch, missing dataset or bad checksum.
void restore_stage(const CheckpointReader& reader, const GptConfig& cfg,
                   const ParameterTable& local, const StageState& state);
// Reads only this rank's rows of each tensor (state.shards: a ZeRO shard,
// or a plan cut for the read) into its shard, so each byte of the file is
// read once per data-parallel group, then checks every tensor's checksum
// on one rank of `group` after a gather. Collective over `group`; the same
// errors on every rank of it. Returns the bytes this rank read.
int64_t restore_shard(const CheckpointReader& reader, const GptConfig& cfg,
                      const ParameterTable& local, const StageState& state, MPI_Comm group);
// The whole flat buffer on every rank of `group` from each rank's shard.
void gather_shards(const ShardPlan& plan, const float* shard, float* whole, MPI_Comm group);
// zero 0: every rank of `group` holds the whole stage; each reads its rows
// of a plan cut over the group (restore_shard), then the group gathers
// them into `whole`. Returns the bytes this rank read.
int64_t restore_whole_stage(const CheckpointReader& reader, const GptConfig& cfg,
                            const ParameterTable& local, const StageRange& range,
                            const StageState& whole, MPI_Comm group);

}  // namespace mpiformer
