// What the CUDA op set carries from op to op (the host twin: host/ops.hpp's
// Context): the stream every kernel of a stage runs on, the cuBLASLt handle
// bound to it, and the scratch the kernels share, so no op allocates.
// Also a micro-batch's tokens on the device, uploaded from pinned memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cuda/device.hpp"
#include "cuda/embedding.hpp"
#include "cuda/gemm.hpp"
#include "cuda/offload_copies.hpp"
#include "cuda/reduce.hpp"

namespace mpiformer::cuda {

class Context {
 public:
  // Binds the calling thread to `device` and creates the stage's stream.
  explicit Context(int device);
  ~Context();  // waits for the stream (not while unwinding), then releases it
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  std::string device_name() const;
  cudaStream_t stream() const { return stream_; }
  Blas& blas() { return *blas_; }
  // kReduceBlocks partial sums (cuda/reduce.hpp), and one double for a result.
  double* reduce_scratch() const { return reduce_.get(); }
  double* reduce_result() const { return reduce_.get() + kReduceBlocks; }
  // Waits for the stream. It polls rather than blocks, calling the wait
  // check between polls, so a failure elsewhere (a communicator's peer
  // gone) surfaces as an exception instead of a hang.
  void synchronize();
  // Waits for an event likewise.
  void wait_for(cudaEvent_t event);
  // The offloaded optimizer's copy streams, made at first use.
  OffloadCopies& offload_copies();
  void set_wait_check(std::function<void()> check) { wait_check_ = std::move(check); }
  // Reads one double of device memory (waits for the stream).
  double read(const double* device_value);
  TokenGroups& token_groups() { return groups_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Blas> blas_;
  DeviceBuffer<double> reduce_;
  PinnedBuffer<double> scalar_;
  TokenGroups groups_;  // host-side scratch for the embedding's grouping
  std::function<void()> wait_check_;
  std::unique_ptr<OffloadCopies> offload_copies_;
};

// A micro-batch's token ids on the device, and (for the embedding's
// backward) its positions grouped by token. Staged through pinned memory in
// one copy; an event tells when the staging buffer may be reused.
class Tokens {
 public:
  Tokens() = default;
  explicit Tokens(int64_t n);
  ~Tokens();
  Tokens(Tokens&& o) noexcept;
  Tokens& operator=(Tokens&& o) noexcept;
  void load(Context& ctx, const int32_t* src, int64_t n, bool grouped);
  const int32_t* data() const { return device_.get(); }
  DeviceTokenGroups groups() const;

 private:
  int64_t n_ = 0, groups_ = 0;
  DeviceBuffer<int32_t> device_;   // ids [n], group tokens [n], starts [n+1], positions [n]
  PinnedBuffer<int32_t> staging_;  // the same layout on the host
  cudaEvent_t uploaded_ = nullptr;
};

}  // namespace mpiformer::cuda
