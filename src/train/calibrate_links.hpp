// `mpiformer calibrate`'s link measurements: all-reduce, reduce-scatter,
// all-gather and send/recv over a group of ranks at sizes from a few KB
// up, fitted to the ring model's latency and bus bandwidth. The same code
// for host MPI on host buffers and for a GPU's communicators (NCCL) on
// device buffers: a LinkTransport says which.
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>

#include "machine_file.hpp"
#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace mpiformer::calibration {

struct LinkTransport {
  // The communicator to measure over `group` (null: the group itself, MPI).
  std::function<std::unique_ptr<Communicator>(MpiCommunicator& group)> connect;
  // n floats where the communicator reads them, all 1.0f (null: host memory).
  std::function<std::shared_ptr<float>(int64_t n)> allocate;
  // Waits until what the communicator queued has run (a GPU's streams).
  std::function<void()> fence;
};

// The four collectives over `comm` (duplicated; not consumed), at sizes up
// to `max_bytes`. Collective over `comm`.
Link measure_link(MPI_Comm comm, double max_bytes, double budget,
                  const LinkTransport& transport = LinkTransport{});

// m.intra over the ranks of this node (`node`), and m.inter over one rank
// per node (node-local rank 0) when the job spans several. Collective over
// MPI_COMM_WORLD.
void measure_links(MPI_Comm node, int node_rank, double max_bytes, double seconds,
                   const LinkTransport& transport, MachineSpec& m);

}  // namespace mpiformer::calibration
