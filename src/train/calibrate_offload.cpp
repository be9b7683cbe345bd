#include "train/calibrate_offload.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <vector>

#include "common/adamw_params.hpp"
#include "core/mpi_check.hpp"
#include "host/adamw.hpp"
#include "host/gemm.hpp"
#include "offload_files.hpp"
#include "parallel/input_agreement.hpp"
#include "plan/rank_memory.hpp"

namespace mpiformer::calibration {

namespace {

// Seconds for every rank of `node` to move its file once, each keeping two
// blocks in flight as the streamed update does (one read ahead or written
// behind while the next is filled).
double pass(OffloadFiles& files, bool write, int64_t block, AlignedFloats (&buffers)[2], MPI_Comm node) {
  MPI_CHECK(MPI_Barrier(node));
  const auto t0 = std::chrono::steady_clock::now();
  std::deque<std::future<void>> pending;
  int next = 0;
  for (int64_t first = 0; first < files.elements(); first += block) {
    if (pending.size() >= 2) {
      pending.front().get();
      pending.pop_front();
    }
    const int64_t n = std::min(block, files.elements() - first);
    float* b = buffers[next++ % 2].get();
    pending.push_back(write ? files.write(0, first, n, b) : files.read(0, first, n, b));
  }
  for (auto& p : pending) p.get();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, node));
  return seconds;
}

}  // namespace

void measure_offload_disk(const std::string& dir, double bytes_per_rank, MachineSpec& m) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int node_size = 1, node_rank = 0;
  MPI_CHECK(MPI_Comm_size(node, &node_size));
  MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  // The first node's ranks measure (each node's disk is its own); its
  // rank 0 tells the others.
  int leader = rank == 0 ? 1 : 0;
  MPI_CHECK(MPI_Bcast(&leader, 1, MPI_INT, 0, node));
  const int64_t block = offload_block_elements(TrainConfig{});  // a run's default
  const int64_t elements = std::max<int64_t>(block, static_cast<int64_t>(bytes_per_rank / 4) / block * block);
  double rates[2] = {0, 0};  // read, write: bytes/s of the node
  std::unique_ptr<OffloadFiles> files;
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    if (leader == 1)
      files = std::make_unique<OffloadFiles>(dir, rank, 0, node_size, std::vector<std::string>{"calibrate"},
                                             elements, "calibrate --offload-dir");
  });
  if (leader == 1) {
    AlignedFloats buffers[2] = {AlignedFloats(block), AlignedFloats(block)};
    const double bytes = 4.0 * static_cast<double>(elements) * node_size;
    rates[1] = bytes / pass(*files, true, block, buffers, node);
    rates[0] = bytes / pass(*files, false, block, buffers, node);
    files.reset();
  }
  MPI_CHECK(MPI_Bcast(rates, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Comm_free(&node));
  m.disk_read_bandwidth = rates[0];
  m.disk_write_bandwidth = rates[1];
}

void measure_host_adamw(MachineSpec& m) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int node_size = 1;
  MPI_CHECK(MPI_Comm_size(node, &node_size));
  int leader = rank == 0 ? 1 : 0;
  MPI_CHECK(MPI_Bcast(&leader, 1, MPI_INT, 0, node));
  // The node's cores shared by its ranks, as a run shares them (trainer.cpp).
  host::set_compute_threads(host::choose_compute_threads(0, node_size));
  double rate = 0;
  if (leader == 1) {
    // 64 MiB of each array a rank (far past any cache), in the update's
    // chunks, one warm-up pass and then the best of three.
    const int64_t n = int64_t{16} << 20;
    std::vector<float> p(n, 1.0f), g(n, 1e-3f), mom(n, 0.0f), vel(n, 0.0f);
    std::vector<AdamWChunk> chunks;
    append_adamw_chunks(chunks, 0, n, true);
    double best = 0;
    for (int pass = 0; pass < 4; ++pass) {
      MPI_CHECK(MPI_Barrier(node));
      const auto t0 = std::chrono::steady_clock::now();
      host::adamw_update_chunks(p.data(), g.data(), mom.data(), vel.data(), chunks.data(),
                                static_cast<int64_t>(chunks.size()),
                                AdamWParams{1e-4, 0.9, 0.95, 1e-8, 0.1, pass + 1, 1.0});
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, node));
      if (pass > 0) best = best == 0 ? s : std::min(best, s);
    }
    rate = 7.0 * 4 * static_cast<double>(n) * node_size / best;
  }
  MPI_CHECK(MPI_Bcast(&rate, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  MPI_CHECK(MPI_Comm_free(&node));
  m.host_adamw_bandwidth = rate;
}

}  // namespace mpiformer::calibration
