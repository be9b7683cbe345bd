#include "parallel/host_staged_communicator.hpp"

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_check.hpp"

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

// Copies on the compute stream, so they are ordered with the stage's
// kernels (a copy on the legacy stream is not: the compute stream is
// non-blocking). To the host: complete on return.
void to_host(void* dst, const void* src, size_t bytes, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
}
// To the device: queued before any later kernel; the source may be reused
// at once (a copy from pageable memory returns once it has been read).
void to_device(void* dst, const void* src, size_t bytes, void* stream) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                             static_cast<cudaStream_t>(stream)));
}

// Where rank's part starts among the parts, and their total.
std::pair<int64_t, int64_t> part_place(const std::vector<int64_t>& counts, int rank) {
  int64_t before = 0, total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) < rank) before += counts[r];
    total += counts[r];
  }
  return {before, total};
}

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(MpiCommunicator& group, void* compute_stream)
    : group_(group), compute_(compute_stream) {}

template <class T>
void HostStagedCommunicator::allreduce(T* data, int64_t n) {
  const size_t bytes = sizeof(T) * static_cast<size_t>(n);
  staging_.resize(bytes);
  to_host(staging_.data(), data, bytes, compute_);
  group_.allreduce_sum(reinterpret_cast<T*>(staging_.data()), n);
  to_device(data, staging_.data(), bytes, compute_);
}

void HostStagedCommunicator::allreduce_sum(float* data, int64_t n) { allreduce(data, n); }
void HostStagedCommunicator::allreduce_sum(double* data, int64_t n) { allreduce(data, n); }

void HostStagedCommunicator::allreduce(void* data, int64_t n, Element type, Reduction op) {
  const size_t bytes = element_bytes(type) * static_cast<size_t>(n);
  staging_.resize(bytes);
  to_host(staging_.data(), data, bytes, compute_);
  group_.allreduce(staging_.data(), n, type, op);
  to_device(data, staging_.data(), bytes, compute_);
}

Pending HostStagedCommunicator::start_allreduce_sum(float* data, int64_t n) {
  allreduce(data, n);
  return std::make_unique<Done>();
}

Pending HostStagedCommunicator::start_reduce_scatter_sum(const float* send, float* recv,
                                                          const std::vector<int64_t>& counts) {
  const auto [before, total] = part_place(counts, rank());
  std::vector<float> all(static_cast<size_t>(total));
  to_host(all.data(), send, sizeof(float) * all.size(), compute_);
  std::vector<float> mine(static_cast<size_t>(counts[rank()]));  // MPI forbids aliasing
  group_.start_reduce_scatter_sum(all.data(), mine.data(), counts)->wait();
  to_device(recv, mine.data(), sizeof(float) * mine.size(), compute_);
  return std::make_unique<Done>();
}

Pending HostStagedCommunicator::start_allgather(const void* send, void* recv,
                                                const std::vector<int64_t>& counts,
                                                size_t elem_bytes) {
  const auto [before, total] = part_place(counts, rank());
  staging_.resize(elem_bytes * static_cast<size_t>(total));
  char* mine = staging_.data() + elem_bytes * static_cast<size_t>(before);
  to_host(mine, send, elem_bytes * static_cast<size_t>(counts[rank()]), compute_);
  group_.start_allgather(mine, staging_.data(), counts, elem_bytes)->wait();
  to_device(recv, staging_.data(), staging_.size(), compute_);
  return std::make_unique<Done>();
}

void HostStagedCommunicator::reduce_scatter(const void* send, void* recv, int64_t part,
                                            Element type) {
  const size_t bytes = element_bytes(type) * static_cast<size_t>(part);
  staging_.resize(bytes * static_cast<size_t>(size() + 1));  // every part, then the result
  to_host(staging_.data(), send, bytes * static_cast<size_t>(size()), compute_);
  char* mine = staging_.data() + bytes * static_cast<size_t>(size());
  group_.reduce_scatter(staging_.data(), mine, part, type);
  to_device(recv, mine, bytes, compute_);
}

void HostStagedCommunicator::allgather(const void* send, void* recv, int64_t part, Element type) {
  const size_t bytes = element_bytes(type) * static_cast<size_t>(part);
  staging_.resize(bytes * static_cast<size_t>(size()));
  char* mine = staging_.data() + bytes * static_cast<size_t>(rank());
  to_host(mine, send, bytes, compute_);
  group_.allgather(mine, staging_.data(), part, type);
  to_device(recv, staging_.data(), staging_.size(), compute_);
}

void HostStagedCommunicator::alltoallv_bytes(const void* send,
                                              const std::vector<int64_t>& send_bytes, void* recv,
                                              const std::vector<int64_t>& recv_bytes) {
  int64_t out = 0, in = 0;
  for (const int64_t b : send_bytes) out += b;
  for (const int64_t b : recv_bytes) in += b;
  staging_.resize(static_cast<size_t>(out + in));
  char* host_send = staging_.data();
  char* host_recv = staging_.data() + out;
  to_host(host_send, send, static_cast<size_t>(out), compute_);
  group_.alltoallv_bytes(host_send, send_bytes, host_recv, recv_bytes);
  to_device(recv, host_recv, static_cast<size_t>(in), compute_);
}

// Staged through the host, nothing overlaps: done when started.
Pending HostStagedCommunicator::start_allreduce(void* data, int64_t n, Element type) {
  allreduce(data, n, type, Reduction::kSum);
  return std::make_unique<Done>();
}

Pending HostStagedCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t part,
                                                     Element type) {
  reduce_scatter(send, recv, part, type);
  return std::make_unique<Done>();
}

Pending HostStagedCommunicator::start_send_bytes(const void* data, size_t bytes, int peer,
                                                 int tag) {
  std::vector<char> copy(bytes);
  to_host(copy.data(), data, bytes, compute_);
  auto op = std::make_unique<StagedSend>(std::move(copy));
  op->start(group_, peer, tag);
  return op;
}

void HostStagedCommunicator::recv_bytes(void* data, size_t bytes, int peer, int tag) {
  staging_.resize(bytes);
  group_.recv_bytes(staging_.data(), bytes, peer, tag);
  // On the compute stream: after the work queued before this receive (which
  // may still read the buffer), before the work queued after it.
  to_device(data, staging_.data(), bytes, compute_);
}

}  // namespace mpiformer
