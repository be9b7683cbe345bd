// The stage's expert-parallel group (model/gpt_stage.hpp's ExpertGroup)
// over communicators: the row counts gathered on the host through MPI (the
// stage sizes its GEMMs and exchanges from them there), the rows
// themselves over the group's communicator of the stage's memory (MPI on
// the host; NCCL's grouped sends and receives, or MPI through host memory,
// on GPUs).
#pragma once
#include <mpi.h>

#include <chrono>
#include <vector>

#include "core/mpi_check.hpp"
#include "model/gpt_stage.hpp"
#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train/tensor_group.hpp"

namespace mpiformer {

// Both must outlive the group; `host` and `rows` are the same ranks in the
// same order. Each all-to-all is reported to `observer` (where set) as
// kExpertAllToAll with the bytes this rank sent to the others.
inline ExpertGroup expert_group(MpiCommunicator& host, Communicator& rows,
                                const TensorOpObserver* observer = nullptr) {
  ExpertGroup g;
  MPI_Comm comm = host.get();
  g.allgather = [comm](const int64_t* mine, int64_t* all, int64_t n) {
    MPI_CHECK(MPI_Allgather(mine, static_cast<int>(n), MPI_INT64_T, all, static_cast<int>(n),
                            MPI_INT64_T, comm));
  };
  Communicator* c = &rows;
  g.alltoallv = [c, observer](const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                              const std::vector<int64_t>& recv_bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    c->alltoallv_bytes(send, send_bytes, recv, recv_bytes);
    if (observer == nullptr || !*observer) return;
    double sent = 0;
    for (size_t r = 0; r < send_bytes.size(); ++r)
      if (static_cast<int>(r) != c->rank()) sent += static_cast<double>(send_bytes[r]);
    (*observer)(kExpertAllToAll, t0, std::chrono::steady_clock::now(), sent);
  };
  return g;
}

}  // namespace mpiformer
