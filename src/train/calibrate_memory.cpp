#include "train/calibrate_memory.hpp"

#include <mpi.h>

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "checkpoint.hpp"
#include "core/host_memory.hpp"
#include "core/mpi_check.hpp"
#include "host/gemm.hpp"
#include "parallel/mpi_communicator.hpp"
#include "plan/memory_report.hpp"
#include "train/backend_factory.hpp"
#include "train/calibration_timing.hpp"

namespace mpiformer::calibration {

double save_overhead(const std::string& path, double bytes) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  const int64_t cols = 1024, rows = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4) / cols);
  std::vector<float> data(rank == 0 ? static_cast<size_t>(rows * cols) : 0, 0.5f);
  DatasetSlice slice;
  slice.name = "/model/calibration_probe";
  slice.shape = {rows, cols};
  if (rank == 0) {
    slice.boxes = {DatasetBox{0, rows, 0, cols}};
    slice.data = data.data();
    slice.reports_checksum = true;
    slice.checksum = tensor_checksum(data.data(), rows * cols);
  }
  malloc_trim(0);
  const bool reset = reset_resident_peak();
  const double before = resident_bytes();
  CheckpointMeta meta;
  meta.run_id = "calibration";
  write_checkpoint(MPI_COMM_WORLD, path, meta, {slice});
  // Beyond the write and read-back buffers the accounting already counts
  // for a run that saves (rank_memory's checkpoint_io): HDF5's and MPI-IO's
  // own. Counting those buffers here too put them twice into every
  // prediction (+32 MB a rank, 38-84% of the tiny deck's rows).
  const double io = rank == 0 ? checkpoint_io_bytes(rows * cols) : 0.0;
  double extra = reset ? std::max(0.0, resident_high_water() - before - io) : 0.0;
  if (rank == 0) std::remove(path.c_str());
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &extra, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return extra;
}

StageProbe probe_stage(const GptConfig& model, int64_t micro_batch, Recompute recompute,
                       double baseline, double budget) {
  // As many blocks as the model has (the factor grows with the stage's
  // depth: more activations, further from the caches), up to what a
  // quarter of this rank's share of the node's memory holds.
  GptConfig cfg = model;
  Deck d;
  d.train.micro_batch = micro_batch;
  d.train.global_batch = micro_batch;
  d.train.recompute = recompute;
  // The probe saves nothing: what a save holds is save_overhead's, beside.
  d.checkpoint.at_end = false;
  BackendChoice cpu;
  int world = 1;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const double budget_bytes = 0.25 * host_available_bytes() / world;
  for (cfg.n_layer = model.n_layer; cfg.n_layer > 1; --cfg.n_layer) {
    d.model = cfg;
    if (rank_memory(d, cpu, 0, SlotKinds::any(1)).total() <= budget_bytes) break;
  }
  const StageRange range{0, cfg.n_layer, true, true};
  // What earlier probes left goes first, so that the stage is measured as
  // a run's would be, over the process's baseline: their memory freed back
  // to the system, and the products' primitives of their shapes dropped
  // (those the stage needs, it builds, as a run does). Kept, every probe
  // counted all earlier ones' primitives too (2 to 30 MB, growing probe by
  // probe); what the libraries keep once started (~6 MB) a run holds too.
  host::forget_products();
  malloc_trim(0);
  reset_resident_peak();
  StageSetup setup;
  setup.options = stage_options(micro_batch, SlotKinds::any(1), recompute, 0);
  auto stage = make_host_backend(cfg, range, setup);
  MPI_Comm self;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_SELF, &self));
  MpiCommunicator tp(self);
  stage->connect_tensor_parallel(tp);
  stage->init_parameters(1);
  const int64_t BT = micro_batch * cfg.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(BT));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % cfg.vocab_size);
  const double measured = seconds_per_call(MPI_COMM_WORLD, budget, [&] {
    stage->forward(0, tokens.data(), tokens.data(), true, 1.0f / static_cast<float>(BT), 0);
    stage->backward(0, false, 0);
  });
  stage->take_loss_sum();
  d.model = cfg;
  const double accounted = rank_memory(d, cpu, 0, SlotKinds::any(1)).total();
  // The run's figure is its peak growth over its baseline.
  double overhead = std::max(0.0, resident_high_water() - baseline - accounted);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &overhead, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return {cfg, micro_batch, recompute, measured, overhead};
}

}  // namespace mpiformer::calibration
