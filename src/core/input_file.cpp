#include "core/input_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace mpiformer {

void require_regular_file(const std::string& path, const std::string& field,
                          const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InputError(path, field, std::string("cannot open: ") + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw InputError(path, field, "a directory, not " + what);
  if (!S_ISREG(st.st_mode)) {
    throw InputError(path, field, "not a regular file (a FIFO or a device?): " + what + " is a file");
  }
}

}  // namespace mpiformer
