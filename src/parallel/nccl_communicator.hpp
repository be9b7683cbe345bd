// Communicator over NCCL for device buffers (cuda build only). The NCCL
// communicator is bootstrapped from the MPI group it mirrors: group rank 0
// makes the unique id, MPI broadcasts it, every rank joins.
//
// Operations run on the communicator's own CUDA stream, ordered against the
// caller's compute stream with events and never by blocking the host: each
// operation starts after the work already enqueued on the compute stream,
// and work enqueued on the compute stream after a blocking call (or after a
// PendingOp's wait()) runs after the operation. So a DP all-reduce overlaps
// the backward that follows it, and a pipeline receive is just a dependency.
//
// NCCL point-to-point ignores tags: messages between two ranks arrive in the
// order they were sent, which is the order the schedules receive them. Use
// one communicator per direction of pipeline traffic: a send blocks its
// stream until the peer receives, so sends and receives of opposite
// directions on one stream could wait on each other.
#pragma once
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace mpiformer {

// True when two ranks of `group` use the same GPU (NCCL refuses that:
// such a group needs HostStagedCommunicator). Collective over the group.
bool group_shares_a_gpu(MpiCommunicator& group);

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `group`; the current CUDA device must be set.
  // `compute_stream` (a cudaStream_t; null: the legacy default stream).
  explicit NcclCommunicator(MpiCommunicator& group, void* compute_stream = nullptr);
  // Destroyed while an exception unwinds (this rank failed), the
  // communicator is aborted, not drained: its stream may hold a send or
  // receive whose peer will never come, and waiting would hang the job
  // instead of letting this rank reach MPI_Abort.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemorySpace buffers() const override { return MemorySpace::kDevice; }
  void allreduce_sum(float* data, int64_t n) override;
  void allreduce_sum(double* data, int64_t n) override;
  Pending start_allreduce_sum(float* data, int64_t n) override;
  void allreduce(void* data, int64_t n, Element type, Reduction op) override;
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
  Pending start_send_bytes(const void* data, size_t bytes, int peer, int tag) override;
  void recv_bytes(void* data, size_t bytes, int peer, int tag) override;
  Pending start_exchange_bytes(const void* send, void* recv, size_t bytes, int to, int from,
                               int tag) override;
  void check_health() override;

 private:
  void after_compute();  // the comm stream waits for the compute stream
  void before_compute(); // the compute stream waits for the comm stream
  Pending record();
  void* comm_ = nullptr;     // ncclComm_t
  void* stream_ = nullptr;   // cudaStream_t
  void* compute_ = nullptr;  // cudaStream_t
  void* event_ = nullptr;    // cudaEvent_t, reused for ordering
  int rank_ = 0, size_ = 0;
};

}  // namespace mpiformer
