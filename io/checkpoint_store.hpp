// A directory of checkpoints: step_<8 digits>.h5 files, complete by
// construction (written under .tmp and renamed), and a `latest` file naming
// the newest (first line) and its run id (second line, "run <id>"), itself
// replaced by write-and-rename. Called on one rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mpiformer {

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string dir);
  std::string path_for_step(int64_t step) const;
  void create_dir() const;
  // Points `latest` at `path` (a file in this directory) of run `run_id`.
  void publish_latest(const std::string& path, const std::string& run_id) const;
  // Removes what saves that never finished left (step_N.h5.tmp, a
  // latest.tmp): only while this job holds the directory's lock. Returns
  // how many files.
  int remove_unfinished() const;
  // The file `latest` names, or "" when there is no `latest`. An InputError
  // when `latest` is not a regular file or names anything but a complete
  // checkpoint of this directory (a .tmp, a path elsewhere).
  std::string latest() const;
  // Complete checkpoints, newest first.
  std::vector<std::string> complete() const;
  // Keeps the newest `keep` complete checkpoints (0: keep all); runs only
  // after a newer one is complete, so it never leaves none.
  void prune(int64_t keep) const;
  // Bytes free to an unprivileged writer on the directory's file system
  // (-1: unknown).
  int64_t free_bytes() const;
  // The step in a checkpoint's name.
  static int64_t step_of(const std::string& path);
  // Moves `paths` (complete checkpoints here), and `latest` if it names
  // one of them, into a new subdirectory superseded-<UTC time>; returns it.
  // Nothing is deleted: another run's files are kept, out of the way.
  std::string set_aside(const std::vector<std::string>& paths) const;

 private:
  std::string dir_;
};

}  // namespace mpiformer
