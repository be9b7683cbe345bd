// Checkpoint save and load bandwidth for the model a deck describes, at the
// number of ranks it is launched with (dp = ranks, so every rank writes a
// row block of every tensor). Usage:
//   mpirun -np N mpiformer_bench_checkpoint DECK DIR [--set k=v]...
// Prints one line: ranks, bytes, save s, save MB/s, load s, load MB/s.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "deck.hpp"
#include "train/stage_backend.hpp"
#include "train/checkpointing.hpp"

int main(int argc, char** argv) {
  using namespace mpiformer;
  using Clock = std::chrono::steady_clock;
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  {
    std::vector<std::string> sets;
    for (int i = 3; i + 1 < argc; i += 2) sets.push_back(argv[i + 1]);
    const Deck deck = load_deck(argv[1], sets);
    const std::string dir = argv[2];
    GptConfig cfg = deck.model;
    ProcessGrid grid(world, 1);
    const auto stage = make_host_backend(cfg, partition_stage(cfg, 0, 1), StageSetup{});
    stage->init_parameters(1);
    const StageState st = stage->host_state();
    std::fill_n(st.adam_m, stage->param_storage(), 0.5f);
    std::fill_n(st.adam_v, stage->param_storage(), 0.25f);
    CheckpointMeta meta;
    set_model_config(meta, cfg);
    meta.world_size = world;
    meta.dp = world;
    meta.deck = deck.to_toml();
    const std::string path = dir + "/bench_checkpoint.h5";

    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = Clock::now();
    write_checkpoint(MPI_COMM_WORLD, path, meta, checkpoint_slices(cfg, stage->table(), st, grid));
    MPI_Barrier(MPI_COMM_WORLD);
    const double save = std::chrono::duration<double>(Clock::now() - t0).count();

    t0 = Clock::now();
    {
      CheckpointReader reader(path);
      restore_whole_stage(reader, cfg, stage->table(), stage->range(), st, read_groups(grid));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double load = std::chrono::duration<double>(Clock::now() - t0).count();
    const ParameterTable whole(cfg, StageRange{0, cfg.n_layer, true, true});
    const double bytes = 3.0 * 4.0 * static_cast<double>(whole.total_numel());
    if (rank == 0) {
      // Each rank reads its rows (each byte once for the dp replicas),
      // then the replicas gather the whole model: the load moves `bytes`
      // from the file system and (world - 1) / world x bytes per rank
      // between ranks.
      std::printf("ranks %d | checkpoint %.0f MB | save %.2f s, %.0f MB/s | load (read once, "
                  "gathered) %.2f s, %.0f MB/s\n",
                  world, bytes / 1e6, save, bytes / 1e6 / save, load, bytes / 1e6 / load);
      std::remove(path.c_str());
    }
  }
  MPI_Finalize();
  return 0;
}
