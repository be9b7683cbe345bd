#include "core/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace mpiformer {

namespace {

std::string kind_of(mode_t m) {
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  return "something else";
}

[[noreturn]] void refuse(const std::string& path, const std::string& what, const std::string& kind) {
  throw InputError(path, what,
                   "not a regular file (" + kind + "): refusing to write through it (remove it, "
                   "or choose another place)");
}

}  // namespace

int open_output(const std::string& path, OutputMode mode, const std::string& what, bool truncate) {
  struct stat st {};
  if (mode == OutputMode::kReplace) {
    if (::lstat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) refuse(path, what, kind_of(st.st_mode));
      if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        throw InputError(path, what, std::string("cannot replace it: ") + std::strerror(errno));
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      // EEXIST: something took the name between the removal and the
      // creation; it is not ours to write through.
      if (errno == EEXIST && ::lstat(path.c_str(), &st) == 0) refuse(path, what, kind_of(st.st_mode));
      throw InputError(path, what, std::string("cannot write: ") + std::strerror(errno));
    }
    return fd;
  }
  // In place: O_NOFOLLOW refuses a link (ELOOP); O_NONBLOCK keeps a FIFO
  // without a reader from blocking the open (it is refused below).
  int flags = O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  if (mode == OutputMode::kAppend) flags |= O_APPEND;
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    const int err = errno;
    if ((err == ELOOP || err == ENXIO || err == EISDIR) && ::lstat(path.c_str(), &st) == 0)
      refuse(path, what, kind_of(st.st_mode));
    throw InputError(path, what, std::string("cannot write: ") + std::strerror(err));
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse(path, what, kind_of(st.st_mode));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (truncate && ::ftruncate(fd, 0) != 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(path, what, std::string("cannot empty it: ") + std::strerror(err));
  }
  return fd;
}

std::FILE* open_output_stream(const std::string& path, OutputMode mode, const std::string& what) {
  const int fd = open_output(path, mode, what);
  std::FILE* f = ::fdopen(fd, mode == OutputMode::kAppend ? "a" : "w");
  if (f == nullptr) {
    const int err = errno;
    ::close(fd);
    throw InputError(path, what, std::string("cannot write: ") + std::strerror(err));
  }
  return f;
}

}  // namespace mpiformer
