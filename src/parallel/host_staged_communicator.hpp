// Device buffers moved by MPI through host memory (cuda build only): for
// groups NCCL cannot serve, i.e. ranks sharing one GPU (a workstation with
// one GPU running a dp x pp layout, or a test of one). Every operation
// first waits for the compute stream, copies to the host, runs the MPI
// operation and copies back, so it is correct and slow; NCCL is used
// wherever each rank of a group has its own GPU.
#pragma once
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace mpiformer {

class HostStagedCommunicator final : public Communicator {
 public:
  // `group` must outlive this; `compute_stream` is a cudaStream_t.
  HostStagedCommunicator(MpiCommunicator& group, void* compute_stream);

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  MemorySpace buffers() const override { return MemorySpace::kDevice; }
  void allreduce_sum(float* data, int64_t n) override;
  void allreduce_sum(double* data, int64_t n) override;
  Pending start_allreduce_sum(float* data, int64_t n) override;
  void allreduce(void* data, int64_t n, Element type, Reduction op) override;
  Pending start_reduce_scatter_sum(const float* send, float* recv,
                                   const std::vector<int64_t>& counts) override;
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

 private:
  template <class T>
  void allreduce(T* data, int64_t n);
  MpiCommunicator& group_;
  void* compute_;
  std::vector<char> staging_;
};

}  // namespace mpiformer
