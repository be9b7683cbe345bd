// One job per run directory: an exclusive lock (flock) on <dir>/.lock, taken
// at start and held for the job's life by the rank that takes it. The
// operating system releases it when the process dies, however it dies, so a
// requeued job is never blocked by a dead one; the file's text names the
// holder for the message a second job gets. flock needs a file system that
// supports it across nodes (local disks, Lustre mounted with -o flock,
// GPFS, NFSv4); on others it may not exclude jobs on other nodes.
#pragma once
#include <string>

namespace mpiformer {

class RunLock {
 public:
  // Takes the lock of `dir` (which must exist), or throws InputError naming
  // `dir`, `key` and the holder (host, pid, Slurm job, start time).
  // `name`: the lock file's (one per rank where each rank locks its own,
  // as the offloaded optimizer state does).
  RunLock(const std::string& dir, const std::string& key, const std::string& name = ".lock");
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace mpiformer
