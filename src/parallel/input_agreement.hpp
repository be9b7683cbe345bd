// Makes input errors collective. Each rank checks its inputs on its own (a
// file may be missing on one node only); if any rank fails, every rank
// throws the same InputError, the one of the lowest failing rank, so the
// driver prints it once and all ranks exit non-zero instead of some ranks
// waiting forever in the next collective.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>

#include "core/mpi_check.hpp"  // lowest_rank_message

namespace mpiformer {

// Runs `local_checks` (which must make no collective call) on every rank of
// `comm`, then agrees on the outcome with one all-reduce and a broadcast.
void agree_on_input_errors(MPI_Comm comm, const std::function<void()>& local_checks);

// Every rank passes its view of one input (a file's header, written as
// text); when any rank's differs from rank 0's (a file edited between node
// launches, a node-local copy), every rank throws the same InputError naming
// `file` and `field`, with both views. One all-gather of a hash otherwise.
void agree_on_view(MPI_Comm comm, const std::string& view, const std::string& file,
                   const std::string& field);

}  // namespace mpiformer
