#include "block_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace mpiformer {
namespace {

// O_DIRECT's alignment of offsets, lengths and buffers: 4 KiB covers the
// 512-byte and 4 KiB logical blocks of the devices and file systems in use.
constexpr int64_t kAlign = 4096;
constexpr size_t kBounce = BlockIo::kStagingBytes;

template <class Io, class Buf>
bool whole(Io io, int fd, Buf* data, size_t n, int64_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t k = io(fd, data + done, n - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      if (k == 0) errno = EIO;  // a short transfer that makes no progress
      return false;
    }
    done += static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

bool pwrite_whole(int fd, const char* data, size_t n, int64_t offset) {
  return whole(::pwrite, fd, data, n, offset);
}
bool pread_whole(int fd, char* data, size_t n, int64_t offset) {
  return whole(::pread, fd, data, n, offset);
}

BlockIo::BlockIo(const std::string& path, int fd, bool try_direct) : fd_(fd) {
  if (!try_direct) return;
  void* p = nullptr;
  if (::posix_memalign(&p, kAlign, kBounce) != 0) return;
  bounce_ = static_cast<char*>(p);
  direct_ = ::open(path.c_str(), O_RDWR | O_DIRECT | O_NOFOLLOW | O_CLOEXEC);
  // The name opened again must still be the caller's file: one swapped in
  // between (another process in the directory) would be written instead.
  struct stat mine {}, again {};
  if (direct_ >= 0 && (::fstat(fd_, &mine) != 0 || ::fstat(direct_, &again) != 0 ||
                       mine.st_dev != again.st_dev || mine.st_ino != again.st_ino)) {
    ::close(direct_);
    direct_ = -1;
  }
}

BlockIo::~BlockIo() {
  if (direct_ >= 0) ::close(direct_);
  std::free(bounce_);
}

template <bool kWrite>
bool BlockIo::transfer(char* data, size_t n, int64_t offset) {
  const auto buffered = [&](int64_t at, int64_t len) {
    char* p = data + (at - offset);
    return kWrite ? pwrite_whole(fd_, p, static_cast<size_t>(len), at)
                  : pread_whole(fd_, p, static_cast<size_t>(len), at);
  };
  const int64_t end = offset + static_cast<int64_t>(n);
  const int64_t body_begin = std::min(end, (offset + kAlign - 1) / kAlign * kAlign);
  const int64_t body_end = std::max(body_begin, end / kAlign * kAlign);
  if (direct_ < 0 || body_end == body_begin) return buffered(offset, end - offset);
  if (body_begin > offset && !buffered(offset, body_begin - offset)) return false;
  for (int64_t at = body_begin; at < body_end;) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(kBounce), body_end - at);
    char* p = data + (at - offset);
    bool ok;
    if constexpr (kWrite) {
      std::memcpy(bounce_, p, static_cast<size_t>(len));
      ok = whole(::pwrite, direct_, bounce_, static_cast<size_t>(len), at);
    } else {
      ok = whole(::pread, direct_, bounce_, static_cast<size_t>(len), at);
      if (ok) std::memcpy(p, bounce_, static_cast<size_t>(len));
    }
    if (!ok) {
      // Refused for direct transfers after all (alignment rules of a file
      // system stricter than 4 KiB): the page cache from here on.
      if (errno != EINVAL) return false;
      ::close(direct_);
      direct_ = -1;
      return buffered(at, end - at);
    }
    at += len;
  }
  return body_end == end || buffered(body_end, end - body_end);
}

bool BlockIo::write(const char* data, size_t n, int64_t offset) {
  return transfer<true>(const_cast<char*>(data), n, offset);
}
bool BlockIo::read(char* data, size_t n, int64_t offset) { return transfer<false>(data, n, offset); }

}  // namespace mpiformer
