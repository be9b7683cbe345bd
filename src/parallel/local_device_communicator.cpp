#include "parallel/local_device_communicator.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/cuda_check.hpp"
#include "parallel/compute_ordered.hpp"

namespace mpiformer {

namespace {

size_t bytes_of(int64_t n, size_t elem) {
  if (n < 0) throw std::logic_error("LocalDeviceCommunicator: negative message size");
  return static_cast<size_t>(n) * elem;
}

void only_part(const std::vector<int64_t>& counts) {
  if (counts.size() != 1)
    throw std::logic_error("LocalDeviceCommunicator: " + std::to_string(counts.size()) +
                           " parts for a group of one rank");
}

}  // namespace

void LocalDeviceCommunicator::copy(void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                             static_cast<cudaStream_t>(compute_)));
}

Pending LocalDeviceCommunicator::start_allreduce_sum(float*, int64_t) {
  return std::make_unique<ComputeOrdered>(compute_);
}

Pending LocalDeviceCommunicator::start_reduce_scatter_sum(const void* send, void* recv,
                                                          const std::vector<int64_t>& counts,
                                                          Element type) {
  only_part(counts);
  copy(recv, send, bytes_of(counts[0], element_bytes(type)));
  return std::make_unique<ComputeOrdered>(compute_);
}

Pending LocalDeviceCommunicator::start_allgather(const void* send, void* recv,
                                                 const std::vector<int64_t>& counts,
                                                 size_t elem_bytes) {
  only_part(counts);
  copy(recv, send, bytes_of(counts[0], elem_bytes));
  return std::make_unique<ComputeOrdered>(compute_);
}

void LocalDeviceCommunicator::reduce_scatter(const void* send, void* recv, int64_t part,
                                             Element type) {
  copy(recv, send, bytes_of(part, element_bytes(type)));
}

void LocalDeviceCommunicator::allgather(const void* send, void* recv, int64_t part, Element type) {
  copy(recv, send, bytes_of(part, element_bytes(type)));
}

Pending LocalDeviceCommunicator::start_allreduce(void*, int64_t, Element) {
  return std::make_unique<ComputeOrdered>(compute_);
}

Pending LocalDeviceCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t part,
                                                      Element type) {
  reduce_scatter(send, recv, part, type);
  return std::make_unique<ComputeOrdered>(compute_);
}

void LocalDeviceCommunicator::alltoallv_bytes(const void* send,
                                              const std::vector<int64_t>& send_bytes, void* recv,
                                              const std::vector<int64_t>& recv_bytes) {
  only_part(send_bytes);
  only_part(recv_bytes);
  if (send_bytes[0] != recv_bytes[0])
    throw std::logic_error("LocalDeviceCommunicator: an exchange with oneself of " +
                           std::to_string(send_bytes[0]) + " bytes out and " +
                           std::to_string(recv_bytes[0]) + " in");
  copy(recv, send, bytes_of(send_bytes[0], 1));
}

Pending LocalDeviceCommunicator::start_send_bytes(const void*, size_t, int peer, int) {
  throw std::logic_error("LocalDeviceCommunicator: a send to rank " + std::to_string(peer) +
                         " in a group of one rank");
}

void LocalDeviceCommunicator::recv_bytes(void*, size_t, int peer, int) {
  throw std::logic_error("LocalDeviceCommunicator: a receive from rank " + std::to_string(peer) +
                         " in a group of one rank");
}

Pending LocalDeviceCommunicator::start_exchange_bytes(const void*, void*, size_t, int to, int, int) {
  throw std::logic_error("LocalDeviceCommunicator: an exchange with rank " + std::to_string(to) +
                         " in a group of one rank");
}

}  // namespace mpiformer
