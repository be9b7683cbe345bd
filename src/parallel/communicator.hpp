// What the trainer moves between ranks, independent of the transport: MPI
// here (host memory), NCCL in the cuda build (device memory). One
// Communicator is one group of ranks: a data-parallel group, a pipeline, or
// the two holders of the tied embedding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace mpiformer {

// A started non-blocking operation. Destroying it waits for it, so no
// operation is ever abandoned with its buffer still in use. For device
// communicators "waits" is stream-ordered: work the caller enqueues on its
// compute stream afterwards runs after the operation, without the host
// blocking.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual void wait() = 0;
  // Drives progress; true once the operation has completed.
  virtual bool test() = 0;
};
using Pending = std::unique_ptr<PendingOp>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In-place sums across the group.
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  virtual Pending start_allreduce_sum(float* data, int64_t n) = 0;

  // Point to point within the group (peer is a group rank), in bytes:
  // activations may be bf16. Sends never block: the buffer must stay
  // untouched until the PendingOp completes.
  virtual Pending start_send_bytes(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv_bytes(void* data, size_t bytes, int peer, int tag) = 0;
  // Throws SystemError if the transport reports a failure that happened
  // asynchronously (a peer gone, a network error): called while the host
  // waits for a device, so a dead job ends instead of hanging.
  virtual void check_health() {}

  Pending start_send(const float* data, int64_t n, int peer, int tag) {
    return start_send_bytes(data, sizeof(float) * static_cast<size_t>(n), peer, tag);
  }
  void recv(float* data, int64_t n, int peer, int tag) {
    recv_bytes(data, sizeof(float) * static_cast<size_t>(n), peer, tag);
  }
};

}  // namespace mpiformer
