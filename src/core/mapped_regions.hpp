// Files the run maps into memory (token datasets; the offloaded optimizer
// state while a checkpoint reads or restores it). When something outside
// the program cuts such a file, touching a page past its new end raises
// SIGBUS, which would kill the rank without a word. Each mapping is
// registered here; a handler (installed with the first) names the file and
// what to do, and ends the process with the mapping's exit code: the rank
// never dies of the signal. A SIGBUS elsewhere goes to the handler that was
// there before (Open MPI's, or the default).
#pragma once
#include <cstddef>
#include <string>

namespace mpiformer {

// `advice` ends the message; `exit_code`: the process's (kExitRequeue for
// state a restart rebuilds, kExitInputError for an input).
void guard_mapped_region(const void* addr, size_t bytes, const std::string& path,
                         const std::string& advice, int exit_code);
void unguard_mapped_region(const void* addr);

}  // namespace mpiformer
