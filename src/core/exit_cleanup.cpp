#include "core/exit_cleanup.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "core/signal_safe_table.hpp"

namespace mpiformer {

namespace {

constexpr size_t kPath = 4096;
struct Entry {
  unsigned long dev = 0, ino = 0;
  char path[kPath] = {};
};
SignalSafeTable<Entry, 64> files;

}  // namespace

void remove_at_abnormal_exit(const std::string& path, unsigned long dev, unsigned long ino) {
  if (path.size() >= kPath) return;
  files.add([&](Entry& e) {
    std::memcpy(e.path, path.c_str(), path.size() + 1);
    e.dev = dev;
    e.ino = ino;
  });
}

void forget_at_abnormal_exit(const std::string& path) {
  files.remove_if([&](const Entry& e) { return path == e.path; });
}

void remove_registered_files() noexcept {
  files.for_each([](const Entry& e) {
    struct stat st {};
    if (::stat(e.path, &st) == 0 && st.st_dev == e.dev && st.st_ino == e.ino) ::unlink(e.path);
  });
}

}  // namespace mpiformer
