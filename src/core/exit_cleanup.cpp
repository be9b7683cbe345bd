#include "core/exit_cleanup.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace mpiformer {

namespace {

constexpr int kFiles = 64;
constexpr size_t kPath = 4096;
struct Entry {
  std::atomic<bool> used{false};
  unsigned long dev = 0, ino = 0;
  char path[kPath] = {};
};
Entry entries[kFiles];
std::mutex table_mutex;  // registration only

}  // namespace

void remove_at_abnormal_exit(const std::string& path, unsigned long dev, unsigned long ino) {
  if (path.size() >= kPath) return;
  const std::lock_guard<std::mutex> lock(table_mutex);
  for (Entry& e : entries) {
    if (e.used.load(std::memory_order_relaxed)) continue;
    std::memcpy(e.path, path.c_str(), path.size() + 1);
    e.dev = dev;
    e.ino = ino;
    e.used.store(true, std::memory_order_release);
    return;
  }
}

void forget_at_abnormal_exit(const std::string& path) {
  const std::lock_guard<std::mutex> lock(table_mutex);
  for (Entry& e : entries)
    if (e.used.load(std::memory_order_relaxed) && path == e.path)
      e.used.store(false, std::memory_order_release);
}

void remove_registered_files() noexcept {
  for (Entry& e : entries) {
    if (!e.used.load(std::memory_order_acquire)) continue;
    struct stat st {};
    if (::stat(e.path, &st) == 0 && st.st_dev == e.dev && st.st_ino == e.ino) ::unlink(e.path);
  }
}

}  // namespace mpiformer
