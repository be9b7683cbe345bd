// Checks an MPI call; on failure names the call, the file, the line, the rank
// and MPI's own reason, and throws (the driver turns it into MPI_Abort so no
// rank is left waiting).
#pragma once
#include <mpi.h>

#include <string>

#include "core/error.hpp"

namespace mpiformer {
std::string mpi_error_string(int code);
int world_rank();
// `text` of rank `root`, on every rank of `comm`.
void broadcast_string(MPI_Comm comm, std::string& text, int root);
// Collective: the text of the lowest rank whose `mine` is not empty, on
// every rank (`label_rank`: with " (on rank R)" past rank 0); empty when
// no rank has one. For conditions each rank finds alone that all must act
// on alike.
std::string lowest_rank_message(MPI_Comm comm, const std::string& mine, bool label_rank = true);
}  // namespace mpiformer

#define MPI_CHECK(call)                                                                   \
  do {                                                                                    \
    const int mpiformer_rc_ = (call);                                                     \
    if (mpiformer_rc_ != MPI_SUCCESS)                                                     \
      ::mpiformer::throw_system_error(#call, __FILE__, __LINE__,                          \
                                      "rank " + std::to_string(::mpiformer::world_rank()) + \
                                          ": " + ::mpiformer::mpi_error_string(mpiformer_rc_)); \
  } while (0)
