// A file mapped read-only for the readers of large binary formats (token
// shards, Megatron's .bin/.idx, weight files): the page cache does the
// buffering and only the pages read are touched. An empty file maps to
// nothing. Refuses what is not a regular file (a FIFO would block, a
// device never end), naming the file.
#pragma once
#include <cstdint>
#include <string>

namespace mpiformer {

class MappedFile {
 public:
  // `what` names the file's role in messages ("index (.idx)", ...).
  explicit MappedFile(const std::string& path, const std::string& what = "file");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* data() const { return static_cast<const char*>(map_); }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace mpiformer
