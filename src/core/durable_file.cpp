#include "core/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

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
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) throw SystemError("cannot write " + tmp + ": " + reason());
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const std::string why = ok ? "" : reason();
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    throw SystemError("cannot write " + tmp + ": " + (ok ? reason() : why));
  }
  durable_rename(tmp, path);
}

}  // namespace mpiformer
