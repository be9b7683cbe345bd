// Files a process removes however it ends short of SIGKILL: the offloaded
// optimizer state (as large as the model) must not outlive a run that
// ends by an error (MPI_Abort), the watchdog (_exit) or a mapped file cut
// under it (the SIGBUS handler), none of which run destructors. The
// removal is async-signal-safe (unlink of fixed buffers). After a SIGKILL
// the next run that takes the directory removes what is left, and says so.
#pragma once
#include <string>

namespace mpiformer {

// `dev` and `ino`: the file's identity, so a file another process put in
// its place later is never removed.
void remove_at_abnormal_exit(const std::string& path, unsigned long dev, unsigned long ino);
void forget_at_abnormal_exit(const std::string& path);
// Unlinks every registered path (abnormal exits call it).
void remove_registered_files() noexcept;

}  // namespace mpiformer
