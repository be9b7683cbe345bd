// Which communicator a group of GPU ranks gets, decided once for the
// trainer and for calibrate (cuda build only): the rank alone, a local
// stream-ordered copy (no NCCL, no MPI); every rank on its own GPU, NCCL;
// ranks sharing a GPU (NCCL refuses that) or a build without NCCL, MPI
// through host memory. Collective over `group` (all its ranks decide
// alike, so their initialisations pair up).
#pragma once
#include <memory>
#include <string>

#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace mpiformer {

// `stream` is the compute stream (a cudaStream_t). `how`, when given, is
// set to a few words for the log ("NCCL", "local", "MPI through host
// memory; ranks share a GPU").
std::unique_ptr<Communicator> device_transport(MpiCommunicator& group, void* stream,
                                               std::string* how = nullptr);

}  // namespace mpiformer
