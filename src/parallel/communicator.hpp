// What the trainer moves between ranks, independent of the transport: MPI
// here (host memory), NCCL in the cuda build (device memory). One
// Communicator is one group of ranks: a data-parallel group, a pipeline, or
// the two holders of the tied embedding.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/precision_plan.hpp"

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
  // wait(), returning the seconds it took (the time a caller stood still
  // for the operation: the straggler watch counts it as a wait).
  double timed_wait() {
    const auto t0 = std::chrono::steady_clock::now();
    wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Drives progress; true once the operation has completed.
  virtual bool test() = 0;
  // Makes a device stream (a cudaStream_t) wait for the operation, without
  // the host waiting: work queued on `stream` afterwards sees its result
  // (the offloaded optimizer's gradient copies start so, bucket by bucket,
  // during backward). Host operations complete on the host first.
  virtual void order_stream(void* stream) {
    (void)stream;
    wait();
  }
};
using Pending = std::unique_ptr<PendingOp>;

// Two operations as one: waited, tested and ordered together.
class PendingPair final : public PendingOp {
 public:
  PendingPair(Pending a, Pending b) : a_(std::move(a)), b_(std::move(b)) {}
  void wait() override {
    a_->wait();
    b_->wait();
  }
  bool test() override {
    const bool a = a_->test();
    return b_->test() && a;  // both driven every time
  }
  void order_stream(void* stream) override {
    a_->order_stream(stream);
    b_->order_stream(stream);
  }

 private:
  Pending a_, b_;
};

enum class Reduction { kSum, kMax };

// Where the buffers handed to a communicator's operations must live. A
// device stage handed a host communicator would have MPI read device
// pointers from the host (a crash, and unordered against the stream).
enum class MemorySpace { kHost, kDevice };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual MemorySpace buffers() const = 0;

  // In-place sums across the group.
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  virtual Pending start_allreduce_sum(float* data, int64_t n) = 0;
  // In place, of elements of `type` (host MPI reduces bf16 and fp16 in
  // float and rounds once). Every rank receives the same bits (the tensor
  // group relies on it: its replicated parameters must stay identical).
  virtual void allreduce(void* data, int64_t n, Element type, Reduction op) = 0;
  // ZeRO's pair. Parts are in rank order, rank r's of counts[r] elements.
  // Reduce-scatter: `send` holds every part (sum of counts); the sum over
  // the group of this rank's part lands in `recv` (counts[rank()]). `recv`
  // may be this rank's own part of `send` (in place: ZeRO 1 reduces into
  // the stage's gradients); the other parts are undefined afterwards.
  // Elements of `type` (f32, or 16-bit: [train] grad_dtype's gradients;
  // host MPI then sums pairs in float and rounds each to 16 bits, as a
  // device's collective does, so 16 bits travel).
  virtual Pending start_reduce_scatter_sum(const void* send, void* recv,
                                           const std::vector<int64_t>& counts, Element type) = 0;
  Pending start_reduce_scatter_sum(const float* send, float* recv,
                                   const std::vector<int64_t>& counts) {
    return start_reduce_scatter_sum(send, recv, counts, Element::kF32);
  }
  // All-gather: this rank's part, at `send` (elements of elem_bytes, 2 or
  // 4; host MPI also 8), lands at its place in `recv`, and every other
  // rank's at theirs.
  // `send` may be that very place (in place).
  virtual Pending start_allgather(const void* send, void* recv, const std::vector<int64_t>& counts,
                                  size_t elem_bytes) = 0;
  // The tensor group's pair under sequence parallelism: equal parts of
  // `part` elements of `type`, blocking (a device communicator: ordered on
  // the compute stream, the host does not wait). Reduce-scatter: `send`
  // holds size() parts in rank order; the group's sum of part rank() lands
  // in `recv` (host MPI sums 16-bit parts in float and rounds once). `send`
  // and `recv` must not overlap. All-gather: this rank's part at `send`
  // lands at part rank() of `recv`, every other rank's at theirs; `send`
  // may be that very place.
  virtual void reduce_scatter(const void* send, void* recv, int64_t part, Element type) = 0;
  virtual void allgather(const void* send, void* recv, int64_t part, Element type) = 0;
  // The same sum and reduce-scatter started, for the tensor group to
  // overlap with compute that does not touch the buffers (a weight
  // gradient's GEMM); the result is in place once the PendingOp is waited
  // for (a 16-bit host sum is rounded back then).
  virtual Pending start_allreduce(void* data, int64_t n, Element type) = 0;
  virtual Pending start_reduce_scatter(const void* send, void* recv, int64_t part,
                                       Element type) = 0;

  // Expert parallelism's exchange, in bytes, blocking (a device
  // communicator: ordered on the compute stream). `send` holds size()
  // blocks in rank order, block r (send_bytes[r]) for group rank r; block r
  // of `recv` (recv_bytes[r], in rank order) receives what rank r sent
  // this rank. The sizes must agree pairwise: exchange them first
  // (exchange_counts, mpi_communicator.hpp). Buffers must not overlap.
  virtual void alltoallv_bytes(const void* send, const std::vector<int64_t>& send_bytes,
                               void* recv, const std::vector<int64_t>& recv_bytes) = 0;

  // Point to point within the group (peer is a group rank), in bytes:
  // activations may be bf16. Sends never block: the buffer must stay
  // untouched until the PendingOp completes.
  virtual Pending start_send_bytes(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv_bytes(void* data, size_t bytes, int peer, int tag) = 0;
  // One step of a ring: `bytes` from `send` to rank `to` and as many into
  // `recv` from rank `from`, started together (NCCL needs a ring's sends
  // and receives grouped, or every rank's send waits on a receive queued
  // behind its neighbour's send). Neither buffer may be touched until the
  // PendingOp completes; `recv` holds the message then.
  virtual Pending start_exchange_bytes(const void* send, void* recv, size_t bytes, int to, int from,
                                       int tag) = 0;
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
