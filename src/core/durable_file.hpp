// Files that are either whole or absent, even across a crash or a power
// loss: written under a temporary name, flushed to disk, renamed into
// place, and the directory flushed so the new name is on disk too. Used by
// checkpoints, the `latest` pointer and prep's outputs.
#pragma once
#include <cstdio>
#include <string>

namespace mpiformer {

// Moves the finished file `tmp` to `path`: fsync(tmp), rename, fsync of the
// directory. Throws SystemError naming the file and the reason.
void durable_rename(const std::string& tmp, const std::string& path);

// Writes `text` to `path` through `path`.tmp and durable_rename.
void write_file_durably(const std::string& path, const std::string& text);

// A file written piece by piece that appears at `path` only whole: the
// pieces go to `path`.tmp, commit() moves it into place durably, and a
// writer destroyed before commit() (an error on the way) removes the .tmp.
// A failed write (a full disk) throws SystemError naming the file.
class DurableWriter {
 public:
  explicit DurableWriter(std::string path);
  ~DurableWriter();
  DurableWriter(const DurableWriter&) = delete;
  DurableWriter& operator=(const DurableWriter&) = delete;
  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
};

}  // namespace mpiformer
