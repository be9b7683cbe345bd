// AdamW's moments for one stage's optimizer (its whole state under zero 0,
// its shard under ZeRO), wherever [train] offload puts them, and the update
// over them. Both optimizers (replicated_state.hpp, zero_shards.hpp) hold
// one; the masters and gradients stay theirs.
//
//   none: in the back end's memory beside the weights; one pass of the
//     back end's AdamW over the whole chunk list.
//   host: in host memory (a GPU run's moments leave device memory).
//   nvme: in two files under [train] offload_dir (io/offload_files.hpp).
//
// Offloaded, the update streams the moments through the back end's own
// AdamW block by block (OffloadSetup::block_elements at a time): a block's moments are
// read (nvme: the next block's read while this one computes; the last
// one's written back behind it), moved to where the masters and gradients
// are (a GPU's memory; nothing to move on the host), updated by the same
// kernel over the same chunks, and moved back. Each element's arithmetic
// is the same whatever the placement (common/adamw_math.hpp), so the
// numbers are bit-identical to `none` on every layout.
#pragma once
#include <algorithm>
#include <array>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/adamw_params.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/settings.hpp"
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
};

template <class Ops>
class AdamWState {
 public:
  using Act = typename Ops::Act;
  using Acc = typename Ops::Acc;
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;

  // Moments of `n` elements; `chunks`: the update's list (offsets into the
  // moments and gradients; param_offset into the masters).
  AdamWState(typename Ops::Context& ctx, int64_t n, const std::vector<AdamWChunk>& chunks,
             const OffloadSetup& where)
      : ctx_(ctx), n_(n), where_(where.where), block_(where.block_elements) {
    if (where_ == Offload::kNone) {
      m_ = Buffer<Acc>(static_cast<size_t>(n));
      v_ = Buffer<Acc>(static_cast<size_t>(n));
      Ops::fill_zero(ctx_, m_.get(), n);
      Ops::fill_zero(ctx_, v_.get(), n);
      upload_chunks(chunks);
      return;
    }
    if (block_ <= 0 || block_ % OffloadFiles::kAlignElements != 0)
      throw std::logic_error("AdamWState: offloading needs whole aligned blocks");
    if constexpr (!std::is_same_v<Acc, float>) {
      throw std::logic_error("offloaded optimizer state is float (a double stage is a test's)");
    } else {
      split_into_blocks(chunks);
      if (where_ == Offload::kHost) {
        host_[0].assign(static_cast<size_t>(n), 0.0f);
        host_[1].assign(static_cast<size_t>(n), 0.0f);
      } else {
        files_ = std::make_unique<OffloadFiles>(where.dir, where.rank, where.ranks_here,
                                                std::vector<std::string>{"adam_m", "adam_v"}, n);
      }
      const int64_t block = std::min(n, block_);
      const int ring = where_ == Offload::kNvme ? 3 : 0;
      for (int s = 0; s < ring; ++s)
        for (auto& b : slots_[s].moment) b = AlignedFloats(block);
      if constexpr (!Ops::kHostMemory) {
        for (auto& d : device_) d = Buffer<Acc>(static_cast<size_t>(block));
      }
    }
  }

  Offload where() const { return where_; }
  // Bytes of the moments outside the back end's memory (host or disk).
  double offloaded_bytes() const { return where_ == Offload::kNone ? 0 : 8.0 * static_cast<double>(n_); }
  const OffloadFiles* files() const { return files_.get(); }

  // The update: `master` and `grads` where the back end keeps them (its
  // memory), `weights` the Act copy the chunks' offsets index (mixed
  // precision; null in fp32).
  void step(Acc* master, const Acc* grads, const AdamWParams& p, Act* weights) {
    if (where_ == Offload::kNone) {
      Ops::adamw(ctx_, master, grads, m_.get(), v_.get(), chunks_.get(), chunk_count_, p, weights);
      return;
    }
    // No view of the files may be mapped while direct I/O writes them.
    release_views();
    if constexpr (std::is_same_v<Acc, float>) streamed_step(master, grads, p, weights);
  }

  // The moments in host memory, for checkpoints and the checks before them
  // (device memory when not offloaded: the caller copies them out). Files
  // are mapped; release_views() when done.
  bool in_host_memory() const { return where_ != Offload::kNone || Ops::kHostMemory; }
  Acc* moment(int k) {
    if (where_ == Offload::kNone) return k == 0 ? m_.get() : v_.get();
    if constexpr (std::is_same_v<Acc, float>) {
      if (where_ == Offload::kHost) return host_[k].data();
      return files_->map(k);
    }
    return nullptr;
  }
  void release_views() {
    if (files_) files_->unmap_all();
  }
  // From host memory (n each; null: zero).
  void load(const float* m, const float* v) {
    const float* src[2] = {m, v};
    for (int k = 0; k < 2; ++k) {
      if (where_ == Offload::kNone) {
        Acc* dst = k == 0 ? m_.get() : v_.get();
        if (src[k] != nullptr) Ops::upload(ctx_, dst, src[k], n_);
        else Ops::fill_zero(ctx_, dst, n_);
        continue;
      }
      if constexpr (std::is_same_v<Acc, float>) {
        if (where_ == Offload::kHost) {
          float* dst = host_[k].data();
          if (src[k] == dst) continue;  // restored in place (moments_in_place)
          if (src[k] != nullptr) std::memcpy(dst, src[k], sizeof(float) * static_cast<size_t>(n_));
          else std::memset(dst, 0, sizeof(float) * static_cast<size_t>(n_));
        } else if (!files_->is_view(k, src[k])) {
          write_file(k, src[k]);
        }
      }
    }
    release_views();
  }

 private:
  // A run of the state, [first, first + length), and the chunks inside it
  // (offsets relative to `first`; parameters where they were).
  struct Block {
    int64_t first = 0, length = 0;
    int64_t chunk_begin = 0, chunk_count = 0;  // in chunks_
  };
  // One block's moments in host memory, and its transfers in flight.
  struct Slot {
    std::array<AlignedFloats, 2> moment;
    std::vector<std::future<void>> pending;
  };

  // Moment k's file from host memory (null: zeros), block by block
  // through the ring's first slot, with the update's direct writes.
  void write_file(int k, const float* src) {
    release_views();
    Slot& s = slots_[0];
    for (const Block& b : blocks_) {
      float* buf = s.moment[0].get();
      if (src != nullptr) std::memcpy(buf, src + b.first, sizeof(float) * static_cast<size_t>(b.length));
      else std::memset(buf, 0, sizeof(float) * static_cast<size_t>(b.length));
      files_->write(k, b.first, b.length, buf).get();
    }
  }

  void upload_chunks(const std::vector<AdamWChunk>& chunks) {
    chunk_count_ = static_cast<int64_t>(chunks.size());
    chunks_ = Buffer<AdamWChunk>(chunks.size());
    Ops::upload(ctx_, chunks_.get(), chunks.data(), chunk_count_);
  }

  // Blocks start at multiples of the block size (aligned for direct I/O);
  // a chunk across a boundary is cut in two there (each element's update
  // is its own, so the cut changes nothing).
  void split_into_blocks(const std::vector<AdamWChunk>& chunks) {
    std::vector<AdamWChunk> rebased;
    for (int64_t first = 0; first < n_; first += block_) {
      Block b;
      b.first = first;
      b.length = std::min(block_, n_ - first);
      b.chunk_begin = static_cast<int64_t>(rebased.size());
      const int64_t end = first + b.length;
      for (const AdamWChunk& c : chunks) {
        const int64_t lo = std::max(c.offset, first), hi = std::min(c.offset + c.length, end);
        if (lo >= hi) continue;
        rebased.push_back(AdamWChunk{lo - first, c.param_offset + (lo - c.offset),
                                     static_cast<int32_t>(hi - lo), c.decay});
      }
      b.chunk_count = static_cast<int64_t>(rebased.size()) - b.chunk_begin;
      blocks_.push_back(b);
    }
    upload_chunks(rebased);
  }

  void streamed_step(Acc* master, const Acc* grads, const AdamWParams& p, Act* weights) {
    const int64_t count = static_cast<int64_t>(blocks_.size());
    const auto read = [&](int64_t i) {
      Slot& s = slots_[i % 3];
      for (auto& f : s.pending) f.get();  // its last block's writes are done
      s.pending.clear();
      for (int k = 0; k < 2; ++k)
        s.pending.push_back(files_->read(k, blocks_[i].first, blocks_[i].length, s.moment[k].get()));
    };
    try {
      if (where_ == Offload::kNvme && count > 0) read(0);
      for (int64_t i = 0; i < count; ++i) {
        const Block& b = blocks_[i];
        float* host[2] = {nullptr, nullptr};
        if (where_ == Offload::kNvme) {
          if (i + 1 < count) read(i + 1);
          Slot& s = slots_[i % 3];
          for (auto& f : s.pending) f.get();
          s.pending.clear();
          for (int k = 0; k < 2; ++k) host[k] = s.moment[k].get();
        } else {
          for (int k = 0; k < 2; ++k) host[k] = host_[k].data() + b.first;
        }
        update_block(b, host, master, grads, p, weights);
        if (where_ == Offload::kNvme) {
          Slot& s = slots_[i % 3];
          for (int k = 0; k < 2; ++k) s.pending.push_back(files_->write(k, b.first, b.length, host[k]));
        }
      }
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

  // One block: the moments from host memory through the back end's AdamW.
  void update_block(const Block& b, float* host[2], Acc* master, const Acc* grads,
                    const AdamWParams& p, Act* weights) {
    Acc* m = host[0];
    Acc* v = host[1];
    if constexpr (!Ops::kHostMemory) {
      Ops::upload(ctx_, device_[0].get(), host[0], b.length);
      Ops::upload(ctx_, device_[1].get(), host[1], b.length);
      m = device_[0].get();
      v = device_[1].get();
    }
    Ops::adamw(ctx_, master, grads + b.first, m, v, chunks_.get() + b.chunk_begin, b.chunk_count, p,
               weights != nullptr ? weights + b.first : nullptr);
    if constexpr (!Ops::kHostMemory) {
      Ops::download(ctx_, host[0], device_[0].get(), b.length);
      Ops::download(ctx_, host[1], device_[1].get(), b.length);
    }
  }

  typename Ops::Context& ctx_;
  int64_t n_;
  Offload where_;
  int64_t block_;
  Buffer<Acc> m_, v_;                  // none
  std::vector<float> host_[2];         // host
  std::unique_ptr<OffloadFiles> files_;  // nvme
  std::array<Slot, 3> slots_;          // nvme: read ahead, computing, written behind
  Buffer<Acc> device_[2];              // a GPU's block of each moment
  std::vector<Block> blocks_;
  Buffer<AdamWChunk> chunks_;
  int64_t chunk_count_ = 0;
};

}  // namespace mpiformer
