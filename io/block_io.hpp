// A checkpoint's bytes to and from its file, around the page cache where
// the file system allows: the whole 4 KiB blocks inside a run go through a
// second descriptor opened O_DIRECT, staged in an aligned buffer; the
// partial blocks at a run's ends (shared with a neighbour rank's rows, or
// with HDF5's own bytes) through the page cache. Why: a buffered write
// copies every byte into the page cache, and on some hosts that intake,
// not the disk, is the limit (this project's VM: about 250 MB/s buffered
// against 1.5 GB/s direct to the same disk); and a read-back through
// O_DIRECT comes from the disk by construction. Where O_DIRECT is refused
// (tmpfs, some network file systems) every byte goes through the page
// cache, as before. No MPI, no HDF5: safe on a writer thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mpiformer {

class BlockIo {
 public:
  // The aligned staging buffer's size (where O_DIRECT is used): large
  // requests keep the device busy.
  static constexpr size_t kStagingBytes = size_t{16} << 20;

  // `fd`: the file opened for reading and writing (the caller's); `path`
  // is opened again with O_DIRECT where possible (and `try_direct`).
  BlockIo(const std::string& path, int fd, bool try_direct = true);
  ~BlockIo();
  BlockIo(const BlockIo&) = delete;
  BlockIo& operator=(const BlockIo&) = delete;

  // n bytes at `offset`, whole; false with errno set on failure.
  bool write(const char* data, size_t n, int64_t offset);
  bool read(char* data, size_t n, int64_t offset);
  // Whether whole blocks bypass the page cache.
  bool direct() const { return direct_ >= 0; }

 private:
  template <bool kWrite>
  bool transfer(char* data, size_t n, int64_t offset);
  int fd_;
  int direct_ = -1;
  char* bounce_ = nullptr;
};

// n bytes at `offset` of `fd` through pwrite/pread, whole (they may do less).
bool pwrite_whole(int fd, const char* data, size_t n, int64_t offset);
bool pread_whole(int fd, char* data, size_t n, int64_t offset);

}  // namespace mpiformer
