#include "parallel/host_staged_communicator.hpp"

#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"

namespace mpiformer {

namespace {

// An operation that finished before it was returned.
class Done final : public PendingOp {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// A send from a host copy that the operation owns until MPI is done with it.
class StagedSend final : public PendingOp {
 public:
  explicit StagedSend(std::vector<char> copy) : copy_(std::move(copy)) {}
  void start(MpiCommunicator& group, int peer, int tag) {
    inner_ = group.start_send_bytes(copy_.data(), copy_.size(), peer, tag);
  }
  ~StagedSend() override { inner_.reset(); }
  void wait() override { inner_->wait(); }
  bool test() override { return inner_->test(); }

 private:
  std::vector<char> copy_;
  Pending inner_;
};

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(MpiCommunicator& group, void* compute_stream)
    : group_(group), compute_(compute_stream) {}

template <class T>
void HostStagedCommunicator::allreduce(T* data, int64_t n) {
  const size_t bytes = sizeof(T) * static_cast<size_t>(n);
  staging_.resize(bytes);
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(compute_)));
  CUDA_CHECK(cudaMemcpy(staging_.data(), data, bytes, cudaMemcpyDeviceToHost));
  group_.allreduce_sum(reinterpret_cast<T*>(staging_.data()), n);
  CUDA_CHECK(cudaMemcpy(data, staging_.data(), bytes, cudaMemcpyHostToDevice));
}

void HostStagedCommunicator::allreduce_sum(float* data, int64_t n) { allreduce(data, n); }
void HostStagedCommunicator::allreduce_sum(double* data, int64_t n) { allreduce(data, n); }

Pending HostStagedCommunicator::start_allreduce_sum(float* data, int64_t n) {
  allreduce(data, n);
  return std::make_unique<Done>();
}

Pending HostStagedCommunicator::start_send_bytes(const void* data, size_t bytes, int peer,
                                                 int tag) {
  std::vector<char> copy(bytes);
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(compute_)));
  CUDA_CHECK(cudaMemcpy(copy.data(), data, bytes, cudaMemcpyDeviceToHost));
  auto op = std::make_unique<StagedSend>(std::move(copy));
  op->start(group_, peer, tag);
  return op;
}

void HostStagedCommunicator::recv_bytes(void* data, size_t bytes, int peer, int tag) {
  staging_.resize(bytes);
  group_.recv_bytes(staging_.data(), bytes, peer, tag);
  // The buffer may still be read by work queued before this receive.
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(compute_)));
  CUDA_CHECK(cudaMemcpy(data, staging_.data(), bytes, cudaMemcpyHostToDevice));
}

void HostStagedCommunicator::broadcast(float* data, int64_t n, int root) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  staging_.resize(bytes);
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(compute_)));
  CUDA_CHECK(cudaMemcpy(staging_.data(), data, bytes, cudaMemcpyDeviceToHost));
  group_.broadcast(reinterpret_cast<float*>(staging_.data()), n, root);
  CUDA_CHECK(cudaMemcpy(data, staging_.data(), bytes, cudaMemcpyHostToDevice));
}

}  // namespace mpiformer
