#include "core/durable_file.hpp"

#include "core/output_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.hpp"

namespace mpiformer {

namespace {

std::string reason() { return std::strerror(errno); }

// fsync of a file or directory by path.
void sync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw SystemError("cannot open " + path + " to flush it: " + reason());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? reason() : "";
  ::close(fd);
  if (rc != 0) throw SystemError("cannot flush " + path + " to disk: " + why);
}

}  // namespace

void durable_rename(const std::string& tmp, const std::string& path) {
  // The data on disk before the name points at it: a crash can never leave
  // a complete-looking name over data still in the page cache.
  sync_path(tmp, O_RDONLY);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw SystemError("cannot rename " + tmp + " to " + path + ": " + reason());
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  sync_path(dir, O_RDONLY | O_DIRECTORY);
}

void write_file_durably(const std::string& path, const std::string& text) {
  DurableWriter out(path);
  out.write(text.data(), text.size());
  out.commit();
}

DurableWriter::DurableWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  // The .tmp is ours to replace: a link in its place is removed, never
  // written through.
  try {
    file_ = open_output_stream(tmp_, OutputMode::kReplace, "");
  } catch (const InputError& e) {
    throw SystemError(e.what());  // a durable write's failure, as every other of its steps
  }
}

DurableWriter::~DurableWriter() {
  if (file_ == nullptr) return;
  std::fclose(file_);
  std::remove(tmp_.c_str());
}

void DurableWriter::write(const void* data, size_t bytes) {
  if (std::fwrite(data, 1, bytes, file_) != bytes) {
    throw StorageError("cannot write " + tmp_ + ": " + reason());
  }
}

void DurableWriter::commit() {
  // fclose reports what buffered writes could not put on disk (ENOSPC).
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0) {
    const std::string why = reason();
    std::remove(tmp_.c_str());
    throw StorageError("cannot write " + tmp_ + ": " + why);
  }
  try {
    durable_rename(tmp_, path_);
  } catch (...) {
    std::remove(tmp_.c_str());
    throw;
  }
}

}  // namespace mpiformer
