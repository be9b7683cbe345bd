// AdamW's state for one stage's optimizer (its whole state under zero 0,
// its shard under ZeRO), wherever [train] offload puts it, and the update
// over it. Both optimizers (replicated_state.hpp, zero_shards.hpp) hold
// one; the gradients stay theirs.
//
//   none: the moments in the back end's memory beside the masters; one
//     pass of the back end's AdamW over the whole chunk list.
//   host: the moments in host memory (a GPU run's leave device memory).
//   nvme: the moments in files under [train] offload_dir
//     (io/offload_files.hpp).
// Offloaded in mixed precision, the float masters go with the moments
// (core/precision_plan.hpp's masters_offloaded): the back end keeps only
// the 16-bit copy its matmuls read. In fp32 the masters are those weights
// and stay.
//
// Offloaded, the update runs on the host, block by block
// (OffloadSetup::block_elements at a time), through the host's threaded,
// vectorised AdamW: nvme reads the next block while this one computes and
// writes the last one behind it; a GPU copies each block's gradients down
// (the next block's while this one computes, into page-locked buffers)
// and the updated 16-bit copy up (in fp32, the masters down and up
// instead), each way on a copy stream of its own (cuda/offload_copies.hpp:
// block i + 1 goes down, block i computes on the host and block i - 1
// goes up at once; events per staging buffer, no whole-stream waits, and
// the next forward waits on the device for the last upload, not the
// host). A GPU's link carries 6 bytes an element in bf16 (4 down, 2
// up), not the 16 a device-side update of host moments would. Each
// element's arithmetic is the same code on the host and the device
// (common/adamw_math.hpp) and the 16-bit rounding is the same (round to
// nearest even on both), so the numbers are bit-identical to `none` on
// every layout.
#pragma once
#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/adamw_params.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/precision_plan.hpp"
#include "core/settings.hpp"
#include "parallel/communicator.hpp"
#include "host/adamw.hpp"
#include "host/residual.hpp"
#include "host/storage_types.hpp"
#include "offload_files.hpp"

namespace mpiformer {

// Where a rank's optimizer state goes ([train] offload, offload_dir).
struct OffloadSetup {
  Offload where = Offload::kNone;
  std::string dir;     // nvme
  int rank = 0;        // world rank: names the files
  int ranks_here = 1;  // ranks on this node (share the directory's room)
  // The update streams the state in blocks of this many elements ([train]
  // offload_block_mb through plan/rank_memory.hpp's offload_block_elements,
  // a multiple of the files' alignment); needed when offloading.
  int64_t block_elements = 0;
  int world = 0;  // ranks in the job (0: unknown; io/offload_files.hpp's stale ranks)
};

template <class Ops>
class AdamWState {
 public:
  using Act = typename Ops::Act;
  using Acc = typename Ops::Acc;
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;
  template <class U>
  using HostBuffer = typename Ops::template HostBuffer<U>;
  // Act as the host stores it (the same 16 bits as the device's type).
  using HostAct = std::conditional_t<
      Ops::kActElement == Element::kBf16, host::Bf16,
      std::conditional_t<Ops::kActElement == Element::kF16, host::Fp16, Acc>>;
  static_assert(sizeof(HostAct) == sizeof(Act));
  static constexpr bool kWeightCopy = !std::is_same_v<Act, Acc>;

  // The state's parts (files, checkpoints' in-place restore).
  enum Part { kM = 0, kV = 1, kMaster = 2 };

  // State of `n` elements; `chunks`: the update's list (offsets into the
  // moments and gradients; param_offset into the masters).
  AdamWState(typename Ops::Context& ctx, int64_t n, const std::vector<AdamWChunk>& chunks,
             const OffloadSetup& where)
      : ctx_(ctx),
        n_(n),
        where_(where.where),
        block_(where.block_elements),
        parts_(masters_offloaded(where_, kWeightCopy) ? 3 : 2) {
    if (where_ == Offload::kNone) {
      m_ = Buffer<Acc>(static_cast<size_t>(n));
      v_ = Buffer<Acc>(static_cast<size_t>(n));
      Ops::fill_zero(ctx_, m_.get(), n);
      Ops::fill_zero(ctx_, v_.get(), n);
      chunk_count_ = static_cast<int64_t>(chunks.size());
      chunks_ = Buffer<AdamWChunk>(chunks.size());
      Ops::upload(ctx_, chunks_.get(), chunks.data(), chunk_count_);
      return;
    }
    if (block_ <= 0 || block_ % OffloadFiles::kAlignElements != 0)
      throw std::logic_error("AdamWState: offloading needs whole aligned blocks");
    if constexpr (!std::is_same_v<Acc, float>) {
      throw std::logic_error("offloaded optimizer state is float (a double stage is a test's)");
    } else {
      split_into_blocks(chunks);
      if (where_ == Offload::kHost) {
        for (int k = 0; k < parts_; ++k) host_[k].assign(static_cast<size_t>(n), 0.0f);
      } else {
        const std::vector<std::string> names = {"adam_m", "adam_v", "master"};
        files_ = std::make_unique<OffloadFiles>(
            where.dir, where.rank, where.world, where.ranks_here,
            std::vector<std::string>(names.begin(), names.begin() + parts_), n);
      }
      const int64_t block = std::min(n, block_);
      if (where_ == Offload::kNvme)
        for (Slot& s : slots_)
          for (int k = 0; k < parts_; ++k) s.part[k] = AlignedFloats(block);
      if constexpr (!Ops::kHostMemory) {
        for (auto& g : stage_g_) g = HostBuffer<Acc>(static_cast<size_t>(block));
        if (holds_masters()) {
          for (auto& w : stage_w_) w = HostBuffer<HostAct>(static_cast<size_t>(block));
        } else {
          for (auto& p : stage_p_) p = HostBuffer<Acc>(static_cast<size_t>(block));
        }
      }
    }
  }

  ~AdamWState() {
    // Page-locked buffers a copy may still read or write: wait for the
    // copies, unless unwinding (a stream may be stuck behind a failed peer).
    if constexpr (!Ops::kHostMemory) {
      if (copies_used_ && std::uncaught_exceptions() == 0) {
        auto& io = Ops::offload_copies(ctx_);
        for (int b = 0; b < 2; ++b) {
          io.wait_downloaded(b);
          io.wait_uploaded(b);
        }
      }
    }
  }
  AdamWState(const AdamWState&) = delete;
  AdamWState& operator=(const AdamWState&) = delete;

  // Gradients copied during backward (a GPU, offload "host", the
  // data-parallel reduction in buckets): a page-locked host copy of the
  // whole gradient buffer, filled bucket by bucket on the down stream as
  // each bucket's reduction completes on the device, so the step copies
  // down only what changed after the reduction (the tied embedding's sum,
  // the shared kv rows). Not for "nvme": that is for hosts whose memory
  // cannot hold the state, and the copy is a third of it.
  bool can_prefetch_gradients() const {
    return !Ops::kHostMemory && where_ == Offload::kHost && std::is_same_v<Acc, float>;
  }
  void enable_gradient_prefetch() {
    // The copy is in the state's order, where the update then reads it.
    if (!can_prefetch_gradients() || !grads_in_state_order_)
      throw std::logic_error("AdamWState: no gradient prefetch here");
    grads_host_ = HostBuffer<Acc>(static_cast<size_t>(n_));
  }
  // The gradients step() is given are in host memory (ZeRO's offloaded
  // shard, zero_shards.hpp), in the state's order: read there, never
  // copied down; the page-locked blocks they would come through go.
  void enable_host_gradients() {
    if (Ops::kHostMemory || where_ == Offload::kNone || !grads_in_state_order_)
      throw std::logic_error("AdamWState: host gradients need a GPU's offloaded state in its order");
    grads_on_host_ = true;
    for (auto& g : stage_g_) g = HostBuffer<Acc>();
  }
  // Before the last micro-batch's backward.
  void prefetch_begin() {
    fetched_ = 0;
    changed_.clear();
  }
  // Gradients [begin, end) are final once `op` completes: copied to the
  // host after it, on the device's order.
  void prefetch_gradients(const Acc* grads, int64_t begin, int64_t end, PendingOp& op) {
    if constexpr (!Ops::kHostMemory) {
      if (grads_host_.get() == nullptr) return;
      auto& io = Ops::offload_copies(ctx_);
      copies_used_ = true;
      op.order_stream(io.down_stream());
      io.download(grads_host_.get() + begin, grads + begin, bytes(end - begin));
      fetched_ += end - begin;
    }
  }
  // Gradients [first, first + n) changed on the device after their copy.
  void gradients_changed(int64_t first, int64_t n) {
    if (grads_host_.get() != nullptr && n > 0) changed_.push_back({first, n});
  }

  Offload where() const { return where_; }
  // The masters are this state's (offloaded in mixed precision): the
  // caller keeps none, and master() is where they are.
  bool holds_masters() const { return parts_ == 3; }
  // Bytes of the state outside the back end's memory (host or disk).
  double offloaded_bytes() const {
    return where_ == Offload::kNone ? 0 : 4.0 * parts_ * static_cast<double>(n_);
  }
  const OffloadFiles* files() const { return files_.get(); }

  // The update: `master` and `grads` where the back end keeps them (its
  // memory; `master` unused when holds_masters()), `weights` the Act copy
  // the chunks' offsets index (mixed precision; null in fp32, where the
  // masters are what the matmuls read).
  // `grads16`: where chunks flagged `narrow` read their 16-bit gradients
  // (not offloaded: zero_shards.hpp keeps float ones for the streamed
  // update).
  void step(Acc* master, const Acc* grads, const AdamWParams& p, Act* weights,
            const Act* grads16 = nullptr) {
    if (where_ == Offload::kNone) {
      Ops::adamw(ctx_, master, grads, m_.get(), v_.get(), chunks_.get(), chunk_count_, p, weights,
                 grads16);
      return;
    }
    if (grads16 != nullptr) throw std::logic_error("AdamWState: 16-bit gradients offloaded");
    // No view of the files may be mapped while direct I/O writes them.
    release_views();
    if constexpr (std::is_same_v<Acc, float>) streamed_step(master, grads, p, weights);
  }

  // The moments and held masters in host memory, for checkpoints and the
  // checks before them (device memory when not offloaded: the caller
  // copies them out). Files are mapped; release_views() when done.
  bool in_host_memory() const { return where_ != Offload::kNone || Ops::kHostMemory; }
  Acc* moment(int k) {
    if (where_ == Offload::kNone) return k == 0 ? m_.get() : v_.get();
    return part(k);
  }
  Acc* master() { return holds_masters() ? part(kMaster) : nullptr; }
  void release_views() {
    if (!files_) return;
    flush_pending();
    files_->unmap_all();
  }
  // Done with [p, p + n) of a view moment() or master() gave: its pages
  // leave the process's memory (nothing to do for host memory).
  void drop_pages(const float* p, int64_t n) {
    if (files_) files_->drop_pages(p, n);
  }
  // Part k's elements [first, first + n) from host memory, the rest kept:
  // initialisation tensor by tensor without mapping the files (a mapping's
  // pages count in the process's resident memory). Written in ascending
  // order each block is read and written once; the last one on the next
  // step, write_weights, load or view.
  void write_range(int k, int64_t first, int64_t n, const float* src) {
    if constexpr (std::is_same_v<Acc, float>) {
      if (where_ == Offload::kHost) {
        std::memcpy(host_[k].data() + first, src, sizeof(float) * static_cast<size_t>(n));
        return;
      }
      if (where_ != Offload::kNvme) throw std::logic_error("AdamWState::write_range: not offloaded");
      files_->unmap_all();
      float* buf = slots_[1].part[0].get();
      while (n > 0) {
        const int64_t j = first / block_;
        const Block& b = blocks_[j];
        if (pending_part_ != k || pending_block_ != j) {
          flush_pending();
          files_->read(k, b.first, b.length, buf).get();  // fresh files read as zeros
          pending_part_ = k;
          pending_block_ = j;
        }
        const int64_t len = std::min(n, b.first + b.length - first);
        std::memcpy(buf + (first - b.first), src, sizeof(float) * static_cast<size_t>(len));
        first += len;
        src += len;
        n -= len;
      }
    }
  }
  // From host memory (n each; null: zero); `master` read when
  // holds_masters() only. A source that is the part's own place (a view
  // from moment() or master(), written by a restore) is kept as it is.
  void load(const float* master, const float* m, const float* v) {
    const float* src[3] = {m, v, master};
    if (where_ == Offload::kNone) {
      for (int k = 0; k < 2; ++k) {
        Acc* dst = k == 0 ? m_.get() : v_.get();
        if (src[k] != nullptr) Ops::upload(ctx_, dst, src[k], n_);
        else Ops::fill_zero(ctx_, dst, n_);
      }
      return;
    }
    if constexpr (std::is_same_v<Acc, float>) {
      for (int k = 0; k < parts_; ++k) {
        if (where_ == Offload::kHost) {
          float* dst = host_[k].data();
          if (src[k] == dst) continue;  // restored in place
          if (src[k] != nullptr) std::memcpy(dst, src[k], sizeof(float) * static_cast<size_t>(n_));
          else std::memset(dst, 0, sizeof(float) * static_cast<size_t>(n_));
        } else if (!files_->is_view(k, src[k])) {
          write_file(k, src[k]);
        }
      }
    }
    release_views();
  }
  // The held masters rounded into `dest` (the back end's Act copy, each
  // element at its chunk's copy offset): after init and restore.
  void write_weights(Act* dest) {
    if constexpr (std::is_same_v<Acc, float> && kWeightCopy) {
      if (!holds_masters()) throw std::logic_error("AdamWState::write_weights: masters not held");
      release_views();
      if constexpr (!Ops::kHostMemory) {
        if (copies_used_) {  // the last step's uploads read stage_w_
          for (int w = 0; w < 2; ++w) Ops::offload_copies(ctx_).wait_uploaded(w);
        }
      }
      for (const Block& b : blocks_) {
        const float* mst = host_[kMaster].data() + b.first;
        if (where_ == Offload::kNvme) {
          float* buf = slots_[0].part[0].get();
          files_->read(kMaster, b.first, b.length, buf).get();
          mst = buf;
        }
        // Each run to its place in the copy (the chunks' copy offsets).
        if constexpr (Ops::kHostMemory) {
          for (int64_t r = b.run_begin; r < b.run_begin + b.run_count; ++r)
            host::convert(dest + runs_[r].copy, mst + runs_[r].local, runs_[r].length);
        } else {
          host::convert(stage_w_[0].get(), mst, b.length);
          for (int64_t r = b.run_begin; r < b.run_begin + b.run_count; ++r)
            Ops::upload(ctx_, dest + runs_[r].copy,
                        reinterpret_cast<const Act*>(stage_w_[0].get()) + runs_[r].local,
                        runs_[r].length);
          Ops::synchronize(ctx_);  // before stage_w_ is written again
        }
      }
    }
  }

 private:
  // A run of the state, [first, first + length), the chunks inside it
  // (offsets relative to `first`; parameters relative to it too where the
  // host computes on a copy of them, else where they were), and the runs
  // of consecutive elements a GPU copies.
  struct Block {
    int64_t first = 0, length = 0;
    int64_t chunk_begin = 0, chunk_count = 0;  // in host_chunks_
    int64_t run_begin = 0, run_count = 0;      // in runs_
  };
  // Elements [local, local + length) of a block, whose masters, gradients
  // and 16-bit copy are at param, grad and copy (the back end's memory).
  struct Run {
    int64_t local, param, grad, copy, length;
    bool continues(const Run& r) const {
      return local + length == r.local && param + length == r.param && grad + length == r.grad &&
             copy + length == r.copy;
    }
  };
  // One block's state in host memory, and its transfers in flight.
  struct Slot {
    std::array<AlignedFloats, 3> part;
    std::vector<std::future<void>> pending;
  };

  float* part(int k) {
    if constexpr (std::is_same_v<Acc, float>) {
      if (where_ == Offload::kHost) return host_[k].data();
      if (where_ == Offload::kNvme) {
        flush_pending();
        return files_->map(k);
      }
    }
    return nullptr;
  }
  // write_range's block, to its file.
  void flush_pending() {
    if (pending_block_ < 0) return;
    const Block& b = blocks_[pending_block_];
    pending_block_ = -1;
    files_->write(pending_part_, b.first, b.length, slots_[1].part[0].get()).get();
  }

  // Part k's file from host memory (null: zeros), block by block through
  // the ring's first slot, with the update's direct writes.
  void write_file(int k, const float* src) {
    release_views();
    float* buf = slots_[0].part[0].get();
    for (const Block& b : blocks_) {
      if (src != nullptr) std::memcpy(buf, src + b.first, sizeof(float) * static_cast<size_t>(b.length));
      else std::memset(buf, 0, sizeof(float) * static_cast<size_t>(b.length));
      files_->write(k, b.first, b.length, buf).get();
    }
  }

  // Blocks start at multiples of the block size (aligned for direct I/O);
  // a chunk across a boundary is cut in two there (each element's update
  // is its own, so the cut changes nothing).
  void split_into_blocks(const std::vector<AdamWChunk>& chunks) {
    // The host's kernel reads the masters from a copy in block order when
    // they are held here, or copied from a GPU; on the host it updates
    // the caller's in place. Likewise the gradients and the 16-bit copy:
    // a GPU's come and go through buffers in block order, the host's are
    // read and written where they are.
    const bool local_params = holds_masters() || !Ops::kHostMemory;
    const bool local_rest = !Ops::kHostMemory;
    for (int64_t first = 0; first < n_; first += block_) {
      Block b;
      b.first = first;
      b.length = std::min(block_, n_ - first);
      b.chunk_begin = static_cast<int64_t>(host_chunks_.size());
      b.run_begin = static_cast<int64_t>(runs_.size());
      const int64_t end = first + b.length;
      for (const AdamWChunk& c : chunks) {
        const int64_t lo = std::max(c.offset, first), hi = std::min(c.offset + c.length, end);
        if (lo >= hi) continue;
        if (holds_masters() && c.param_offset != c.offset)
          throw std::logic_error("AdamWState: held masters are in the state's order");
        if (c.grad_offset != c.offset) grads_in_state_order_ = false;
        const int64_t local = lo - first, shift = lo - c.offset;
        const Run run{local, c.param_offset + shift, c.grad_offset + shift, c.copy_offset + shift,
                      hi - lo};
        host_chunks_.push_back(AdamWChunk{local, local_params ? local : run.param,
                                          local_rest ? local : run.grad,
                                          local_rest ? local : run.copy,
                                          static_cast<int32_t>(hi - lo), c.decay});
        Run* last = runs_.size() > static_cast<size_t>(b.run_begin) ? &runs_.back() : nullptr;
        if (last != nullptr && last->continues(run))
          last->length += run.length;
        else
          runs_.push_back(run);
      }
      b.chunk_count = static_cast<int64_t>(host_chunks_.size()) - b.chunk_begin;
      b.run_count = static_cast<int64_t>(runs_.size()) - b.run_begin;
      blocks_.push_back(b);
    }
  }

  // nvme: block i's parts into slot i % 3, once that slot's last writes are done.
  void read_block(int64_t i) {
    Slot& s = slots_[i % 3];
    for (auto& f : s.pending) f.get();
    s.pending.clear();
    for (int k = 0; k < parts_; ++k)
      s.pending.push_back(files_->read(k, blocks_[i].first, blocks_[i].length, s.part[k].get()));
  }
  // A GPU: block i's gradients (and in fp32 its masters) queued for the
  // host on the down stream, into buffer i % 2.
  void fetch_block(int64_t i, const Acc* master, const Acc* grads) {
    if constexpr (!Ops::kHostMemory) {
      auto& io = Ops::offload_copies(ctx_);
      const Block& b = blocks_[i];
      const int buf = static_cast<int>(i % 2);
      if (!prefetched_)
        for (int64_t r = b.run_begin; r < b.run_begin + b.run_count; ++r)
          io.download(stage_g_[buf].get() + runs_[r].local, grads + runs_[r].grad,
                      bytes(runs_[r].length));
      if (!holds_masters()) {
        io.download_after_upload(buf);  // block i - 2's masters have left the buffer
        for (int64_t r = b.run_begin; r < b.run_begin + b.run_count; ++r)
          io.download(stage_p_[buf].get() + runs_[r].local, master + runs_[r].param,
                      bytes(runs_[r].length));
      }
      io.downloaded(buf);
    }
  }
  // A GPU: block i's results queued for the device on the up stream (the
  // Act copy, or in fp32 the masters); their buffer stays untouched until
  // wait_uploaded.
  void send_block(int64_t i, Acc* master, Act* weights) {
    if constexpr (!Ops::kHostMemory) {
      auto& io = Ops::offload_copies(ctx_);
      const Block& b = blocks_[i];
      const int buf = static_cast<int>(i % 2);
      for (int64_t r = b.run_begin; r < b.run_begin + b.run_count; ++r) {
        const Run& run = runs_[r];
        if (holds_masters()) {
          io.upload(weights + run.copy, stage_w_[buf].get() + run.local,
                    sizeof(Act) * static_cast<size_t>(run.length));
        } else {
          io.upload(master + run.param, stage_p_[buf].get() + run.local, bytes(run.length));
        }
      }
      io.uploaded(buf);
    }
  }
  static size_t bytes(int64_t n) { return sizeof(Acc) * static_cast<size_t>(n); }

  void streamed_step(Acc* master, const Acc* grads, const AdamWParams& p, Act* weights) {
    constexpr bool kDevice = !Ops::kHostMemory;
    const bool nvme = where_ == Offload::kNvme;
    const int64_t count = static_cast<int64_t>(blocks_.size());
    try {
      if (count > 0) {
        if (nvme) read_block(0);
        if constexpr (kDevice) {
          copies_used_ = true;
          auto& io = Ops::offload_copies(ctx_);
          io.begin();  // after backward's last write of the gradients
          // Every bucket came down during backward: only what changed
          // since comes down now (before block 0's event, so waiting for
          // block 0 waits for it).
          prefetched_ = grads_on_host_ || (grads_host_.get() != nullptr && fetched_ == n_);
          if (prefetched_)
            for (const auto& [first, len] : changed_)
              io.download(grads_host_.get() + first, grads + first, bytes(len));
        }
        fetch_block(0, master, grads);
      }
      for (int64_t i = 0; i < count; ++i) {
        const Block& b = blocks_[i];
        float* state[3] = {nullptr, nullptr, nullptr};
        if (nvme) {
          if (i + 1 < count) read_block(i + 1);
          Slot& s = slots_[i % 3];
          for (auto& f : s.pending) f.get();
          s.pending.clear();
          for (int k = 0; k < parts_; ++k) state[k] = s.part[k].get();
        } else {
          for (int k = 0; k < parts_; ++k) state[k] = host_[k].data() + b.first;
        }
        if constexpr (kDevice) {
          auto& io = Ops::offload_copies(ctx_);
          const int buf = static_cast<int>(i % 2);
          io.wait_downloaded(buf);  // block i is here
          if (i + 1 < count) fetch_block(i + 1, master, grads);
          io.wait_uploaded(buf);  // block i - 2's results have left the buffer the host writes
        }
        update_block(i, state, master, grads, p, weights);
        if constexpr (kDevice) send_block(i, master, weights);
        if (nvme) {
          Slot& s = slots_[i % 3];
          for (int k = 0; k < parts_; ++k)
            s.pending.push_back(files_->write(k, b.first, b.length, state[k]));
        }
      }
      // The next forward waits for the uploads on the device; the host
      // goes on.
      if constexpr (kDevice)
        if (count > 0) Ops::offload_copies(ctx_).end();
      prefetch_begin();
      prefetched_ = false;
      for (Slot& s : slots_) {
        for (auto& f : s.pending) f.get();
        s.pending.clear();
      }
    } catch (...) {
      // Nothing may still write into the slots once the error leaves here.
      for (Slot& s : slots_)
        for (auto& f : s.pending)
          if (f.valid()) f.wait();
      throw;
    }
  }

  // One block through the host's AdamW: the moments (and held masters)
  // from `state`, the gradients and masters where they are or from the
  // buffers a GPU's copies filled.
  void update_block(int64_t i, float* state[3], Acc* master, const Acc* grads,
                    const AdamWParams& p, Act* weights) {
    if constexpr (std::is_same_v<Acc, float>) {
      const Block& b = blocks_[i];
      const AdamWChunk* chunks = host_chunks_.data() + b.chunk_begin;
      float* params = holds_masters() ? state[kMaster] : master;
      const float* g = grads;
      HostAct* copy = nullptr;
      if constexpr (Ops::kHostMemory) {
        copy = weights;
      } else {
        g = grads_on_host_ ? grads + b.first
            : prefetched_  ? grads_host_.get() + b.first
                           : stage_g_[i % 2].get();
        if (holds_masters()) copy = stage_w_[i % 2].get();
        else params = stage_p_[i % 2].get();
      }
      host::adamw_update_chunks(params, g, state[kM], state[kV], chunks, b.chunk_count, p, copy);
    }
  }

  typename Ops::Context& ctx_;
  int64_t n_;
  Offload where_;
  int64_t block_;
  int parts_;                            // 2: the moments; 3: the masters too
  Buffer<Acc> m_, v_;                    // none
  Buffer<AdamWChunk> chunks_;            // none: the back end's kernel's list
  int64_t chunk_count_ = 0;
  std::vector<float> host_[3];           // host: m, v, masters
  std::unique_ptr<OffloadFiles> files_;  // nvme
  std::array<Slot, 3> slots_;            // nvme: read ahead, computing, written behind
  std::vector<Block> blocks_;
  std::vector<AdamWChunk> host_chunks_;  // offloaded: the host kernel's list, by block
  std::vector<Run> runs_;
  bool grads_in_state_order_ = true;  // every chunk's gradients at its state offset
  int pending_part_ = -1;     // write_range's block in slot 1, not yet written
  int64_t pending_block_ = -1;
  // A GPU's page-locked buffers, two of each (one block's in flight while
  // the next computes): the gradients coming down, and the results going
  // up: the Act copy (held masters) or the fp32 masters.
  std::array<HostBuffer<Acc>, 2> stage_g_, stage_p_;
  std::array<HostBuffer<HostAct>, 2> stage_w_;
  bool copies_used_ = false;  // the copy streams exist and may hold copies
  // Gradient prefetch: the host copy, how much of it backward's buckets
  // filled this step, what changed after, and whether the step uses it.
  HostBuffer<Acc> grads_host_;
  int64_t fetched_ = 0;
  std::vector<std::pair<int64_t, int64_t>> changed_;
  bool prefetched_ = false;
  bool grads_on_host_ = false;  // enable_host_gradients
};

}  // namespace mpiformer
