// A directory of checkpoints: step_<8 digits>.h5 files, complete by
// construction (written under .tmp and renamed), and a `latest` file naming
// the newest, itself replaced by write-and-rename. Called on one rank.
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
  // Points `latest` at `path` (a file in this directory).
  void publish_latest(const std::string& path) const;
  // The file `latest` names, or "" when there is no `latest`.
  std::string latest() const;
  // Complete checkpoints, newest first.
  std::vector<std::string> complete() const;
  // Keeps the newest `keep` complete checkpoints (0: keep all); runs only
  // after a newer one is complete, so it never leaves none.
  void prune(int64_t keep) const;

 private:
  std::string dir_;
};

}  // namespace mpiformer
