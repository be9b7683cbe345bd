#include "run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "core/error.hpp"
#include "core/output_file.hpp"
#include "core/format.hpp"

namespace mpiformer {

namespace {

std::string holder_text() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const char* job = std::getenv("SLURM_JOB_ID");
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  return strprintf("host %s, pid %d, Slurm job %s, since %s", host, static_cast<int>(getpid()),
                   job != nullptr ? job : "none", when);
}

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  ssize_t n = 0;
  lseek(fd, 0, SEEK_SET);
  while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

}  // namespace

RunLock::RunLock(const std::string& dir, const std::string& key, const std::string& name) {
  const std::string path = dir + "/" + name;
  // Never written through a link or into a FIFO planted in its place.
  fd_ = open_output(path, OutputMode::kLock, key);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? read_all(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) {
      throw InputError(dir, key, "cannot lock " + name + ": " + std::strerror(err));
    }
    throw InputError(dir, key,
                     "another job is using this directory (" +
                         (holder.empty() ? std::string("holder unknown") : holder) +
                         "): wait for it to end, or choose another directory");
  }
  // The lock is what matters; the text only helps a second job's message,
  // so failing to write it is not an error.
  const std::string me = holder_text() + "\n";
  const bool written = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) >= 0;
  (void)written;
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace mpiformer
