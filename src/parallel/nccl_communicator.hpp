// Communicator over NCCL for device buffers (cuda build only). The NCCL
// communicator is bootstrapped from the MPI group it mirrors: group rank 0
// makes the unique id, MPI broadcasts it, every rank joins. Operations run
// on the communicator's own CUDA stream; blocking calls synchronise it,
// non-blocking ones return a PendingOp that waits on a CUDA event.
#pragma once
#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace mpiformer {

// Chooses this rank's GPU from its rank among the ranks of its node
// (MPI_Comm_split_type shared), modulo the GPUs visible. Returns the device.
int select_local_device();

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `group`; the current CUDA device must be set.
  explicit NcclCommunicator(MpiCommunicator& group);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(float* data, int64_t n) override;
  void allreduce_sum(double* data, int64_t n) override;
  Pending start_allreduce_sum(float* data, int64_t n) override;
  // NCCL point-to-point ignores tags: messages between two ranks arrive in
  // the order they were sent, which is the order the schedules receive them.
  Pending start_send(const float* data, int64_t n, int peer, int tag) override;
  void recv(float* data, int64_t n, int peer, int tag) override;
  void broadcast(float* data, int64_t n, int root) override;

 private:
  Pending record();
  void* comm_ = nullptr;    // ncclComm_t
  void* stream_ = nullptr;  // cudaStream_t
  int rank_ = 0, size_ = 0;
};

}  // namespace mpiformer
