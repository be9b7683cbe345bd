// The offloaded optimizer's copies between a GPU and page-locked host
// memory (train/adamw_state.hpp), on two streams of their own, one each
// way, so that a block's gradients going down, the host's AdamW over the
// block before, and that block's results going up all proceed at once
// (the compute stream's copies would serialise, and a whole-stream wait
// per block would stall both directions).
//
// Ordering is by events, per staging buffer (two: a block's in flight
// while the next computes):
//   begin()                 both streams start after the compute stream's
//                           work so far (the gradients are final);
//   download(b, ...)        queued on the down stream; downloaded(b) marks
//                           buffer b's copies, wait_downloaded(b) waits on
//                           the host for them;
//   upload(b, ...)          likewise up; wait_uploaded(b) before the host
//                           writes buffer b again; download_after_upload(b)
//                           before a download reuses buffer b on the
//                           device's side (fp32: the masters go both ways);
//   end()                   the compute stream's later work (the next
//                           forward reads the weights) waits for the
//                           uploads; the host does not.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace mpiformer::cuda {

class Context;

class OffloadCopies {
 public:
  static constexpr int kBuffers = 2;
  explicit OffloadCopies(Context& ctx);
  ~OffloadCopies();
  OffloadCopies(const OffloadCopies&) = delete;
  OffloadCopies& operator=(const OffloadCopies&) = delete;

  void begin();
  void download(void* host_dst, const void* device_src, size_t bytes);
  void downloaded(int buffer);
  void wait_downloaded(int buffer);
  void upload(void* device_dst, const void* host_src, size_t bytes);
  void uploaded(int buffer);
  void wait_uploaded(int buffer);
  void download_after_upload(int buffer);
  void end();
  // The down stream (a cudaStream_t), for work outside that orders it
  // (a reduction's completion before a gradient bucket's copy).
  void* down_stream() const { return down_; }

 private:
  Context& ctx_;
  cudaStream_t down_ = nullptr, up_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;  // compute -> copies, uploads -> compute
  cudaEvent_t down_ev_[kBuffers] = {}, up_ev_[kBuffers] = {};
};

}  // namespace mpiformer::cuda
