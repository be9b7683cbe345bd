// Communicator over an MPI communicator it owns (freed on destruction).
#pragma once
#include <mpi.h>

#include <vector>

#include "parallel/communicator.hpp"

namespace mpiformer {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (MPI_COMM_NULL gives an empty communicator).
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  bool valid() const { return comm_ != MPI_COMM_NULL; }
  MPI_Comm get() const { return comm_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemorySpace buffers() const override { return MemorySpace::kHost; }
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
  MPI_Comm comm_;
  int rank_ = -1, size_ = 0;
  // 16-bit sums widen into this (kept: the tensor group's sums run in
  // every block of every micro-batch).
  float* widen(const void* data, int64_t n, Element type);
  std::vector<float> wide_;
  // A started 16-bit sum widens into this one (kept too: the tensor group
  // starts one in every column-parallel backward). The stage has one in
  // flight at a time; a second while it is is a programming error.
  float* widen_started(const void* data, int64_t n, Element type);
  std::vector<float> started_wide_;
  bool started_busy_ = false;

 public:
  // Rounds n floats into 16-bit elements of `type` at `data`.
  static void narrow(void* data, const float* wide, int64_t n, Element type);
};

// Each rank's counts for every rank of `group` (counts[r]: what it will
// send rank r), exchanged: the result's [r] is what rank r will send this
// one. Collective over the group; host memory (device communicators post
// their transfers from host counts too).
std::vector<int64_t> exchange_counts(MpiCommunicator& group, const std::vector<int64_t>& counts);

}  // namespace mpiformer
