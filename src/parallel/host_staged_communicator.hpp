// Device buffers moved by MPI through host memory (cuda build only): for
// groups NCCL cannot serve, i.e. ranks sharing one GPU (a workstation with
// one GPU running a dp x pp layout, or a test of one). Every operation
// first waits for the compute stream, copies to the host, runs the MPI
// operation and copies back, so it is correct and slow; NCCL is used
// wherever each rank of a group has its own GPU.
//
// The host side is page-locked (the copies run at the link's rate and
// the copy back is truly asynchronous): one staging buffer, grown as
// needed, whose copy to the device the next operation waits for before
// writing it again (an event, not a stream wait), and a pool of send
// buffers, each returned when its send completes.
#pragma once
#include <memory>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace mpiformer {

class PinnedBytes;     // page-locked host memory (the .cpp's)
class PinnedSendPool;  // page-locked send buffers, reused

class HostStagedCommunicator final : public Communicator {
 public:
  // `group` must outlive this; `compute_stream` is a cudaStream_t.
  HostStagedCommunicator(MpiCommunicator& group, void* compute_stream);
  ~HostStagedCommunicator() override;
  HostStagedCommunicator(const HostStagedCommunicator&) = delete;
  HostStagedCommunicator& operator=(const HostStagedCommunicator&) = delete;

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
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

 private:
  template <class T>
  void allreduce(T* data, int64_t n);
  // The staging buffer, at least `bytes`, once its last copy to the device
  // is done.
  char* staging(size_t bytes);
  // Queues staging [offset, offset + bytes) to `dst` on the compute stream.
  void to_device(void* dst, size_t offset, size_t bytes);
  MpiCommunicator& group_;
  void* compute_;
  std::unique_ptr<PinnedBytes> staging_;
  void* uploaded_ = nullptr;  // cudaEvent_t: the staging buffer's last copy down
  std::shared_ptr<PinnedSendPool> sends_;
};

}  // namespace mpiformer
