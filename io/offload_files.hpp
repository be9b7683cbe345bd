// One rank's optimizer state on disk ([train] offload = "nvme"): a few
// arrays of floats, one file each, under [train] offload_dir, read and
// written in aligned blocks by a small pool of I/O threads so the optimizer
// step computes one block while the next is read and the last is written.
//
// The files bypass the page cache (O_DIRECT) where the file system allows
// it, so neither the cost of the disk is hidden nor the memory saved spent
// on cached copies; elsewhere (some network file systems; tmpfs before
// Linux 6.6) each block is written back and dropped from the cache after
// use (posix_fadvise).
//
// A rank's files are its own: it locks them for its life (a second run
// given the same directory is refused), creates them afresh (files an
// earlier run left are replaced, never read: the state always comes from
// the initialisation or a checkpoint), reserves their space at once (a disk
// without room refuses the run at start, not in its hundredth step), and
// removes them when it ends. They are never a checkpoint: nothing reads
// them but this object. Files of ranks this job does not have (an earlier
// run of more ranks, killed before it could remove them) are removed too,
// each stale rank's by the job's rank k mod world after taking that
// rank's lock (so never a live run's), and their room counts as free.
#pragma once
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace mpiformer {

class RunLock;

class OffloadFiles {
 public:
  // Alignment of every transfer's file offset, length and memory (bytes):
  // what direct I/O asks of the common block sizes (512 B and 4 KiB).
  static constexpr int64_t kAlignBytes = 4096;
  static constexpr int64_t kAlignElements = kAlignBytes / 4;

  // `names.size()` files of `elements` floats each (rounded up to the
  // alignment) in `dir`, for world rank `rank` of `world` (0: unknown, no
  // stale ranks removed); `ranks_here`: ranks of this job on this node
  // (they share a node-local directory's free space).
  // InputError naming `dir` and [train] offload_dir when it is missing, not
  // a directory, not writable, locked by another run or without room.
  // `key`: how the directory was given, for the messages.
  OffloadFiles(const std::string& dir, int rank, int world, int ranks_here,
               const std::vector<std::string>& names, int64_t elements,
               const char* key = "[train] offload_dir");
  ~OffloadFiles();  // waits for transfers in flight, removes the files
  OffloadFiles(const OffloadFiles&) = delete;
  OffloadFiles& operator=(const OffloadFiles&) = delete;

  int64_t elements() const { return elements_; }
  // Bytes on disk, all files.
  double bytes() const;
  bool direct() const { return direct_; }
  // Whether files of an earlier run were found and replaced (this rank's
  // own names); how many ranks' files this rank removed as stale.
  bool replaced_stale() const { return replaced_; }
  int removed_stale_ranks() const { return removed_ranks_; }
  const std::string& path(int file) const { return files_[file].path; }

  // Asynchronous transfers of elements [first, first + n) of `file`:
  // `first` a multiple of kAlignElements, `buffer` aligned to kAlignBytes
  // and room for n rounded up to kAlignElements. The future's get()
  // throws StorageError naming the file, the operation and the offset.
  std::future<void> read(int file, int64_t first, int64_t n, float* buffer);
  std::future<void> write(int file, int64_t first, int64_t n, const float* buffer);

  // The whole file mapped (checkpoints read and write the state through
  // it, page by page; a save's passes drop what they read, drop_pages).
  // unmap_all() writes back, unmaps and drops the pages.
  float* map(int file);
  // The whole pages of [p, p + n) inside a view leave this process's
  // memory (read again from the file if touched): a pass over a view
  // (a checkpoint's) holds a few pages at a time, not the whole file.
  void drop_pages(const float* p, int64_t n);
  void unmap_all();
  // Whether the files are still this run's, as something outside the
  // program could leave them: kCut, a file shorter than the state (its
  // data is lost: a checkpoint taken now would be wrong); kGone, a name
  // removed or pointing at another file (the state is intact behind the
  // run's own descriptors, which every read, write and view uses: a
  // checkpoint taken now is right, but the directory is no longer the
  // run's alone). `what` names the file and what happened.
  struct Integrity {
    enum Kind { kIntact, kGone, kCut } kind = kIntact;
    std::string what;
  };
  Integrity integrity() const;
  // Test hook (MPIFORMER_FAULT_OFFLOAD_TAMPER): does to file 0 through its
  // name what an outside process would: "replace" (another file moved over
  // it), "remove", "cut" (truncated to nothing).
  void tamper(const std::string& action) const;
  // Whether `p` is file `file`'s mapped view.
  bool is_view(int file, const float* p) const { return p != nullptr && p == files_[file].view; }

 private:
  struct File {
    std::string path;
    int fd = -1;         // direct where the file system allows it
    float* view = nullptr;
    unsigned long ino = 0, dev = 0;  // the file this run made (0: not yet)
  };
  void transfer(bool write, int file, int64_t first, int64_t n, float* buffer);
  void remove_all();

  std::string dir_;
  int64_t elements_ = 0, padded_ = 0;
  bool direct_ = true, replaced_ = false;
  int rank_ = 0, removed_ranks_ = 0;
  std::vector<File> files_;
  std::unique_ptr<RunLock> lock_;
  struct Pool;
  std::unique_ptr<Pool> pool_;
  int64_t writes_ = 0;  // for the test hook of a failing disk
};

// An aligned host buffer for OffloadFiles' transfers, zeroed.
class AlignedFloats {
 public:
  AlignedFloats() = default;
  explicit AlignedFloats(int64_t n);
  float* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, Free> data_;
};

}  // namespace mpiformer
