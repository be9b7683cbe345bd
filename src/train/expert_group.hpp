// The stage's expert-parallel group (model/gpt_stage.hpp's ExpertGroup)
// over communicators: the row counts gathered on the host through MPI (the
// stage sizes its GEMMs and exchanges from them there), the rows
// themselves over the group's communicator of the stage's memory (MPI on
// the host; NCCL's grouped sends and receives, or MPI through host memory,
// on GPUs).
#pragma once
#include <mpi.h>

#include <vector>

#include "core/mpi_check.hpp"
#include "model/gpt_stage.hpp"
#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace mpiformer {

// Both must outlive the group; `host` and `rows` are the same ranks in the
// same order.
inline ExpertGroup expert_group(MpiCommunicator& host, Communicator& rows) {
  ExpertGroup g;
  MPI_Comm comm = host.get();
  g.allgather = [comm](const int64_t* mine, int64_t* all, int64_t n) {
    MPI_CHECK(MPI_Allgather(mine, static_cast<int>(n), MPI_INT64_T, all, static_cast<int>(n),
                            MPI_INT64_T, comm));
  };
  Communicator* c = &rows;
  g.alltoallv = [c](const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) {
    c->alltoallv_bytes(send, send_bytes, recv, recv_bytes);
  };
  return g;
}

}  // namespace mpiformer
