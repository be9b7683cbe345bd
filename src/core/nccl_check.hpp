// Checks an NCCL call: the call, the file and line, the rank and NCCL's own
// reason, thrown as SystemError (the driver aborts the job).
#pragma once
#include <nccl.h>

#include <string>

#include "core/error.hpp"
#include "core/mpi_check.hpp"

#define NCCL_CHECK(call)                                                                 \
  do {                                                                                   \
    const ncclResult_t mpiformer_nr_ = (call);                                           \
    if (mpiformer_nr_ != ncclSuccess)                                                    \
      ::mpiformer::throw_system_error(#call, __FILE__, __LINE__,                         \
                                      "rank " + std::to_string(::mpiformer::world_rank()) + \
                                          ": " + ncclGetErrorString(mpiformer_nr_));     \
  } while (0)
