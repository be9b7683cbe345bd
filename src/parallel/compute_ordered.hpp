// A device communicator's operation queued on the compute stream (cuda
// build only: the one-rank local communicator's copies, the host-staged
// communicator's copies back): complete for every later kernel as it is,
// and ordered for another stream by an event recorded there.
#pragma once
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "parallel/communicator.hpp"

namespace mpiformer {

class ComputeOrdered final : public PendingOp {
 public:
  explicit ComputeOrdered(void* compute) : compute_(static_cast<cudaStream_t>(compute)) {}
  void wait() override {}
  bool test() override { return true; }
  void order_stream(void* stream) override {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(e, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), e, 0));
    cudaEventDestroy(e);  // released by CUDA once the wait is satisfied
  }

 private:
  cudaStream_t compute_;
};

}  // namespace mpiformer
