#include "cuda/offload_copies.hpp"

#include <exception>

#include "core/cuda_check.hpp"
#include "cuda/context.hpp"

namespace mpiformer::cuda {

OffloadCopies::OffloadCopies(Context& ctx) : ctx_(ctx) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&ready_, &done_, &down_ev_[0], &down_ev_[1], &up_ev_[0], &up_ev_[1]})
    CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

OffloadCopies::~OffloadCopies() {
  // Copies still queued read or write page-locked buffers their owners are
  // about to free: wait for them, unless unwinding (a stream may be stuck
  // behind a failed peer; the process is ending anyway).
  if (std::uncaught_exceptions() == 0) {
    cudaStreamSynchronize(down_);
    cudaStreamSynchronize(up_);
  }
  for (cudaEvent_t e : {ready_, done_, down_ev_[0], down_ev_[1], up_ev_[0], up_ev_[1]})
    cudaEventDestroy(e);
  cudaStreamDestroy(down_);
  cudaStreamDestroy(up_);
}

void OffloadCopies::begin() {
  CUDA_CHECK(cudaEventRecord(ready_, ctx_.stream()));
  CUDA_CHECK(cudaStreamWaitEvent(down_, ready_, 0));
  CUDA_CHECK(cudaStreamWaitEvent(up_, ready_, 0));
}

void OffloadCopies::download(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes > 0)
    CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, down_));
}
void OffloadCopies::downloaded(int buffer) { CUDA_CHECK(cudaEventRecord(down_ev_[buffer], down_)); }
void OffloadCopies::wait_downloaded(int buffer) { ctx_.wait_for(down_ev_[buffer]); }

void OffloadCopies::upload(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes > 0)
    CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, up_));
}
void OffloadCopies::uploaded(int buffer) { CUDA_CHECK(cudaEventRecord(up_ev_[buffer], up_)); }
void OffloadCopies::wait_uploaded(int buffer) { ctx_.wait_for(up_ev_[buffer]); }
void OffloadCopies::download_after_upload(int buffer) {
  CUDA_CHECK(cudaStreamWaitEvent(down_, up_ev_[buffer], 0));
}

void OffloadCopies::end() {
  CUDA_CHECK(cudaEventRecord(done_, up_));
  CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream(), done_, 0));
}

}  // namespace mpiformer::cuda
