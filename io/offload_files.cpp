#include "offload_files.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>

#include "core/error.hpp"
#include "core/exit_cleanup.hpp"
#include "core/mapped_regions.hpp"
#include "core/format.hpp"
#include "core/test_hooks.hpp"
#include "run_lock.hpp"

namespace mpiformer {

namespace {

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

constexpr const char* kPrefix = "mpiformer-offload.rank";

// The rank a file of `dir` is named for (-1: not an offload file).
int rank_of(const std::string& name) {
  const std::string prefix = kPrefix;
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t at = prefix.size(), end = at;
  while (end < name.size() && end - at < 9 && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == at || end >= name.size() || name[end] != '.') return -1;
  return std::stoi(name.substr(at, end - at));
}

// The size of the regular file `entry` names, never a link's target (a link
// planted under an offload file's name is removed, not followed: its
// target's room is not ours to count); -1 if there is none.
double regular_size(const std::filesystem::directory_entry& entry) {
  std::error_code ec;
  if (!entry.is_regular_file(ec) || entry.is_symlink(ec)) return -1;
  const auto size = entry.file_size(ec);
  return ec ? -1 : static_cast<double>(size);
}

struct StaleFile {
  int rank;
  std::filesystem::path path;
  double size;  // -1: not a regular file (a link), removed but not counted
};

// The offload files (and links under their names) in `dir` of ranks at or
// past `world`.
std::vector<StaleFile> files_past(const std::string& dir, int world) {
  std::vector<StaleFile> found;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int r = rank_of(it->path().filename().string());
    if (r < world) continue;
    std::error_code type_ec;
    const auto type = it->symlink_status(type_ec).type();
    if (type == std::filesystem::file_type::regular || type == std::filesystem::file_type::symlink)
      found.push_back({r, it->path(), regular_size(*it)});
  }
  return found;
}

}  // namespace

// Two threads: one transfer computes while the next is read and the last
// written; more would only queue on one disk.
struct OffloadFiles::Pool {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::packaged_task<void()>> tasks;
  bool stopping = false;
  std::vector<std::thread> threads;

  Pool() {
    for (int i = 0; i < 2; ++i) threads.emplace_back([this] { run(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
  }
  std::future<void> submit(std::function<void()> f) {
    std::packaged_task<void()> task(std::move(f));
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu);
      tasks.push_back(std::move(task));
    }
    cv.notify_one();
    return done;
  }
  void run() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !tasks.empty(); });
        if (tasks.empty()) return;  // stopping, nothing left
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      task();
    }
  }
};

OffloadFiles::OffloadFiles(const std::string& dir, int rank, int world, int ranks_here,
                           const std::vector<std::string>& names, int64_t elements,
                           const char* given_as)
    : dir_(dir), elements_(elements), padded_(round_up(elements, kAlignElements)), rank_(rank) {
  const char* const kKey = given_as;  // how the directory was given
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw InputError(dir, kKey,
                     std::filesystem::exists(dir, ec)
                         ? "not a directory"
                         : "does not exist: create it (node-local scratch, e.g. $TMPDIR or "
                           "/local/$SLURM_JOB_ID) before the run");
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    throw InputError(dir, kKey, std::string("not writable: ") + std::strerror(errno));
  }
  // One lock per rank: a second run given the same directory meets the
  // first's locks before it touches a file.
  lock_ = std::make_unique<RunLock>(dir, kKey, strprintf(".lock-offload-rank%d", rank));
  if (world > 0) {
    // Ranks this job does not have: rank k's files are this rank's to
    // remove when k mod world is this rank (no two of the job's ranks
    // contend for one), once k's lock is taken (a live run holding it
    // keeps its files).
    std::vector<StaleFile> mine;
    for (auto& f : files_past(dir, world))
      if (f.rank % world == rank) mine.push_back(std::move(f));
    std::vector<int> stale;
    for (const auto& f : mine)
      if (std::find(stale.begin(), stale.end(), f.rank) == stale.end()) stale.push_back(f.rank);
    for (int r : stale) {
      try {
        // Once rank r's lock is held, no live run writes r's files: the
        // listing made before it is complete.
        RunLock theirs(dir, kKey, strprintf(".lock-offload-rank%d", r));
        for (const auto& f : mine)
          if (f.rank == r) std::filesystem::remove(f.path, ec);
        ++removed_ranks_;
      } catch (const InputError&) {
        // Held: not stale.
      }
    }
  }
  const double need = 4.0 * static_cast<double>(padded_) * static_cast<double>(names.size());
  // Stale ranks' files that the job's other ranks have still to remove:
  // their room is free too (counted before the file system's free space,
  // so a file removed in between counts twice rather than not at all; the
  // reservation below is the last word).
  double others_stale = 0;
  if (world > 0)
    for (const auto& f : files_past(dir, world)) others_stale += std::max(f.size, 0.0);
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    // Files an earlier run left here are replaced: their space counts as free.
    double old = others_stale;
    for (const auto& name : names) {
      const std::filesystem::directory_entry entry(
          dir + "/" + kPrefix + strprintf("%d.%s", rank, name.c_str()), ec);
      if (!ec) old += std::max(regular_size(entry), 0.0);
    }
    const double free = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) + old;
    if (free < need * ranks_here) {
      throw InputError(dir, kKey,
                       strprintf("no room for the optimizer state: %.1f MB per rank x %d "
                                 "rank(s) on this node = %.1f MB needed, %.1f MB free",
                                 need / 1e6, ranks_here, need * ranks_here / 1e6, free / 1e6));
    }
  }
  direct_ = !test_hooks::offload_buffered();
  for (const auto& name : names) {
    File f;
    f.path = dir + "/" + kPrefix + strprintf("%d.%s", rank, name.c_str());
    if (std::filesystem::exists(f.path, ec)) replaced_ = true;
    std::filesystem::remove(f.path, ec);
    // O_EXCL: a file of this name now is another process's, never reused.
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    f.fd = direct_ ? ::open(f.path.c_str(), flags | O_DIRECT, 0600) : -1;
    if (f.fd < 0 && direct_ && errno == EINVAL) {
      direct_ = false;  // the file system has no direct I/O
      std::filesystem::remove(f.path, ec);
    }
    if (f.fd < 0) f.fd = ::open(f.path.c_str(), flags, 0600);
    if (f.fd < 0) {
      const int err = errno;
      remove_all();
      throw InputError(dir, kKey, strprintf("cannot create %s: %s", f.path.c_str(), std::strerror(err)));
    }
    struct stat made {};
    if (::fstat(f.fd, &made) == 0) f.ino = made.st_ino, f.dev = made.st_dev;
    files_.push_back(f);
    remove_at_abnormal_exit(f.path, f.dev, f.ino);
    // The space now, so a full disk refuses the run here and never fails
    // a step.
    const int err = ::posix_fallocate(f.fd, 0, padded_ * 4);
    if (err != 0) {
      remove_all();
      throw InputError(dir, kKey,
                       strprintf("cannot reserve %.1f MB for %s: %s", need / 1e6,
                                 f.path.c_str(), std::strerror(err)));
    }
  }
  pool_ = std::make_unique<Pool>();
}

OffloadFiles::~OffloadFiles() {
  pool_.reset();  // finishes what is queued
  unmap_all();
  remove_all();
}

double OffloadFiles::bytes() const {
  return 4.0 * static_cast<double>(padded_) * static_cast<double>(files_.size());
}

void OffloadFiles::remove_all() {
  std::error_code ec;
  for (auto& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
    f.fd = -1;
    forget_at_abnormal_exit(f.path);
    // Only the run's own file: a name now pointing elsewhere is not ours.
    struct stat st {};
    if (f.ino != 0 && (::stat(f.path.c_str(), &st) != 0 || st.st_ino != f.ino || st.st_dev != f.dev))
      continue;
    std::filesystem::remove(f.path, ec);
  }
}

std::future<void> OffloadFiles::read(int file, int64_t first, int64_t n, float* buffer) {
  return pool_->submit([=, this] { transfer(false, file, first, n, buffer); });
}

std::future<void> OffloadFiles::write(int file, int64_t first, int64_t n, const float* buffer) {
  const bool fail = rank_ == 0 && ++writes_ == test_hooks::fault_offload_write();
  float* b = const_cast<float*>(buffer);  // transfer() only reads it when writing
  if (fail) {
    const std::string what = files_[file].path;
    return pool_->submit([what, first] {
      throw StorageError(strprintf("offloaded optimizer state: write of %s at byte %lld failed: %s",
                                   what.c_str(), static_cast<long long>(4 * first),
                                   std::strerror(EIO)));
    });
  }
  return pool_->submit([=, this] { transfer(true, file, first, n, b); });
}

void OffloadFiles::transfer(bool write, int file, int64_t first, int64_t n, float* buffer) {
  const File& f = files_[file];
  const int64_t bytes = 4 * round_up(n, kAlignElements);
  char* at = reinterpret_cast<char*>(buffer);
  int64_t done = 0;
  while (done < bytes) {
    const off_t offset = static_cast<off_t>(4 * first + done);
    const ssize_t r = write ? ::pwrite(f.fd, at + done, static_cast<size_t>(bytes - done), offset)
                            : ::pread(f.fd, at + done, static_cast<size_t>(bytes - done), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r == 0 ? EIO : errno;  // a read past the end: the file was cut
      const Integrity now = integrity();
      if (now.kind == Integrity::kCut) throw RestartableError(now.what);
      throw StorageError(strprintf("offloaded optimizer state: %s of %s at byte %lld failed: %s",
                                   write ? "write" : "read", f.path.c_str(),
                                   static_cast<long long>(offset), std::strerror(err)));
    }
    done += r;
  }
  if (!direct_) {
    // Buffered: the block leaves the page cache once it is on disk.
    const off_t offset = static_cast<off_t>(4 * first);
    if (write) ::sync_file_range(f.fd, offset, bytes, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(f.fd, offset, bytes, POSIX_FADV_DONTNEED);
  }
}

float* OffloadFiles::map(int file) {
  File& f = files_[file];
  if (f.view != nullptr) return f.view;
  // The run's own descriptor, never the name opened again: a file moved
  // over the name later is someone else's, and the state is behind this
  // descriptor. (Direct I/O does not apply to a mapping; views are
  // released before the next direct transfer.)
  const Integrity now = integrity();
  if (now.kind == Integrity::kCut) throw RestartableError(now.what);
  void* p = ::mmap(nullptr, static_cast<size_t>(4 * padded_), PROT_READ | PROT_WRITE, MAP_SHARED,
                   f.fd, 0);
  if (p == MAP_FAILED) {
    throw StorageError(strprintf("offloaded optimizer state: cannot map %s: %s", f.path.c_str(),
                                 std::strerror(errno)));
  }
  f.view = static_cast<float*>(p);
  guard_mapped_region(p, static_cast<size_t>(4 * padded_), f.path,
                      "The offloaded optimizer state is lost; the last published checkpoint is "
                      "intact and a restart resumes from it (exit 75, which the job scripts "
                      "requeue)",
                      kExitRequeue);
  return f.view;
}

OffloadFiles::Integrity OffloadFiles::integrity() const {
  for (const File& f : files_) {
    struct stat own {}, named {};
    if (::fstat(f.fd, &own) != 0) continue;
    if (own.st_size < 4 * padded_) {
      return {Integrity::kCut,
              strprintf("offloaded optimizer state: %s was cut to %lld bytes under the run (it "
                        "holds %lld): something outside mpiformer truncated it, and the state "
                        "in it is lost",
                        f.path.c_str(), static_cast<long long>(own.st_size),
                        static_cast<long long>(4 * padded_))};
    }
    const bool there = ::stat(f.path.c_str(), &named) == 0;
    if (!there || named.st_dev != own.st_dev || named.st_ino != own.st_ino) {
      return {Integrity::kGone,
              strprintf("offloaded optimizer state: %s was %s under the run (a scratch cleaner, "
                        "or another job given the same [train] offload_dir?); the run's state "
                        "is intact behind its own open file",
                        f.path.c_str(), there ? "replaced by another file" : "removed")};
    }
  }
  return {};
}

void OffloadFiles::tamper(const std::string& action) const {
  const std::string& path = files_.at(0).path;
  if (action == "replace") {
    const std::string other = path + ".other";
    const int fd = ::open(other.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      if (::ftruncate(fd, 4 * padded_) != 0) std::perror("tamper: ftruncate");
      ::close(fd);
    }
    if (::rename(other.c_str(), path.c_str()) != 0) std::perror("tamper: rename");
  } else if (action == "remove") {
    ::unlink(path.c_str());
  } else if (action == "cut") {
    if (::truncate(path.c_str(), 0) != 0) std::perror("tamper: truncate");
  }
}

void OffloadFiles::drop_pages(const float* p, int64_t n) {
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& f : files_) {
    if (f.view == nullptr || p < f.view || p + n > f.view + padded_) continue;
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t hi = reinterpret_cast<uintptr_t>(p + n) / page * page;
    // Clean or dirty, the data stays in the file's pages: only the mapping goes.
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    return;
  }
}

void OffloadFiles::unmap_all() {
  for (auto& f : files_) {
    if (f.view == nullptr) continue;
    const size_t bytes = static_cast<size_t>(4 * padded_);
    const bool synced = ::msync(f.view, bytes, MS_SYNC) == 0;
    const int err = errno;
    unguard_mapped_region(f.view);
    ::munmap(f.view, bytes);
    f.view = nullptr;
    if (!synced) {
      throw StorageError(strprintf("offloaded optimizer state: writing back %s failed: %s",
                                   f.path.c_str(), std::strerror(err)));
    }
    // Clean now: drop the cached pages the checkpoint's pass left.
    ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  }
}

AlignedFloats::AlignedFloats(int64_t n) {
  void* p = nullptr;
  const size_t bytes = static_cast<size_t>(round_up(4 * n, OffloadFiles::kAlignBytes));
  if (::posix_memalign(&p, OffloadFiles::kAlignBytes, bytes) != 0) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  data_.reset(static_cast<float*>(p));
}

void AlignedFloats::Free::operator()(float* p) const { std::free(p); }

}  // namespace mpiformer
