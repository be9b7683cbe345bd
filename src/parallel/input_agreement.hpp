// Makes input errors collective. Each rank checks its inputs on its own (a
// file may be missing on one node only); if any rank fails, every rank
// throws the same InputError, the one of the lowest failing rank, so the
// driver prints it once and all ranks exit non-zero instead of some ranks
// waiting forever in the next collective.
#pragma once
#include <mpi.h>

#include <functional>

namespace mpiformer {

// Runs `local_checks` (which must make no collective call) on every rank of
// `comm`, then agrees on the outcome with one all-reduce and a broadcast.
void agree_on_input_errors(MPI_Comm comm, const std::function<void()>& local_checks);

}  // namespace mpiformer
