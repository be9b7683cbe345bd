// The communicator of a group of one rank whose buffers live on the GPU
// (cuda build only). No message ever leaves the rank, so it needs neither
// NCCL nor MPI: every collective is the identity, and the ones whose
// output is another buffer (ZeRO's reduce-scatter and gather at dp = 1,
// the tensor group's pair at tp = 1) are device-to-device copies queued on
// the compute stream, ordered with the stage's kernels like any of them.
// A run of one GPU therefore starts and trains where NCCL cannot
// initialise; NCCL is needed only where a group has peers.
#pragma once
#include <vector>

#include "parallel/communicator.hpp"

namespace mpiformer {

class LocalDeviceCommunicator final : public Communicator {
 public:
  // `compute_stream` is a cudaStream_t (null: the legacy default stream).
  explicit LocalDeviceCommunicator(void* compute_stream) : compute_(compute_stream) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  MemorySpace buffers() const override { return MemorySpace::kDevice; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  Pending start_allreduce_sum(float* data, int64_t n) override;
  void allreduce(void*, int64_t, Element, Reduction) override {}
  Pending start_reduce_scatter_sum(const void* send, void* recv,
                                   const std::vector<int64_t>& counts, Element type) override;
  using Communicator::start_reduce_scatter_sum;
  Pending start_allgather(const void* send, void* recv, const std::vector<int64_t>& counts,
                          size_t elem_bytes) override;
  void reduce_scatter(const void* send, void* recv, int64_t part, Element type) override;
  void allgather(const void* send, void* recv, int64_t part, Element type) override;
  Pending start_allreduce(void* data, int64_t n, Element type) override;
  Pending start_reduce_scatter(const void* send, void* recv, int64_t part, Element type) override;
  void alltoallv_bytes(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                       const std::vector<int64_t>& recv_bytes) override;
  // A group of one has no peer: a call is a bug in the caller (the
  // schedules of one stage never send), reported as such.
  Pending start_send_bytes(const void* data, size_t bytes, int peer, int tag) override;
  void recv_bytes(void* data, size_t bytes, int peer, int tag) override;
  Pending start_exchange_bytes(const void* send, void* recv, size_t bytes, int to, int from,
                               int tag) override;

 private:
  void copy(void* dst, const void* src, size_t bytes);
  void* compute_;
};

}  // namespace mpiformer
