#include "train/calibrate_disk.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <future>

#include "core/mpi_check.hpp"
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
      files = std::make_unique<OffloadFiles>(dir, rank, node_size, std::vector<std::string>{"calibrate"},
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

}  // namespace mpiformer::calibration
