#include "mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"
#include "core/mapped_regions.hpp"

namespace mpiformer {

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
  // Checked before the open, which would block on a FIFO.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw InputError(path, "", "not a regular file (the " + what + " must be a file)");
  fd_ = ::open(path.c_str(), O_RDONLY);
  if (fd_ < 0) throw InputError(path, "", "cannot open the " + what + ": " + std::strerror(errno));
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw InputError(path, "", "not a regular file (the " + what + " must be a file)");
  }
  size_ = st.st_size;
  if (size_ == 0) return;
  map_ = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    ::close(fd_);
    throw InputError(path, "", std::string("cannot map: ") + std::strerror(errno));
  }
  // A dataset cut under the run ends it as bad input, naming the file, not
  // with a bus error.
  guard_mapped_region(map_, static_cast<size_t>(size_), path,
                      "The " + what + " changed under the run: restore it and run again (exit 2)",
                      kExitInputError);
}

MappedFile::~MappedFile() {
  if (map_ != nullptr) unguard_mapped_region(map_);
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace mpiformer
