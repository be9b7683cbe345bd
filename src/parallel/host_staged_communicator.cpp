#include "parallel/host_staged_communicator.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>

#include "core/cuda_check.hpp"
#include "parallel/compute_ordered.hpp"

namespace mpiformer {

// Page-locked host bytes (cudaMallocHost): copies to and from them run at
// the link's rate, and a copy to the device returns before it has read them.
class PinnedBytes {
 public:
  explicit PinnedBytes(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) CUDA_CHECK(cudaMallocHost(&data_, bytes));
  }
  ~PinnedBytes() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
  char* data() const { return static_cast<char*>(data_); }
  size_t size() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

// Send buffers are taken for a send and given back when it completes (a
// pipeline sends the same sizes step after step, so the pool settles at a
// few buffers).
class PinnedSendPool {
 public:
  std::unique_ptr<PinnedBytes> take(size_t bytes) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if ((*it)->size() >= bytes) {
        auto b = std::move(*it);
        free_.erase(it);
        return b;
      }
    }
    return std::make_unique<PinnedBytes>(bytes);
  }
  void give(std::unique_ptr<PinnedBytes> b) {
    constexpr size_t kKept = 8;  // a send in flight per pipeline direction, and some
    if (free_.size() < kKept) free_.push_back(std::move(b));
  }

 private:
  std::vector<std::unique_ptr<PinnedBytes>> free_;
};

namespace {

// A send from a page-locked copy that the operation owns until MPI is done
// with it, then gives back to the pool.
class StagedSend final : public PendingOp {
 public:
  StagedSend(std::shared_ptr<PinnedSendPool> pool, std::unique_ptr<PinnedBytes> copy, size_t bytes)
      : pool_(std::move(pool)), copy_(std::move(copy)), bytes_(bytes) {}
  void start(MpiCommunicator& group, int peer, int tag) {
    inner_ = group.start_send_bytes(copy_->data(), bytes_, peer, tag);
  }
  ~StagedSend() override {
    inner_.reset();  // waits for the send
    pool_->give(std::move(copy_));
  }
  void wait() override { inner_->wait(); }
  bool test() override { return inner_->test(); }

 private:
  std::shared_ptr<PinnedSendPool> pool_;
  std::unique_ptr<PinnedBytes> copy_;
  size_t bytes_;
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
    : group_(group), compute_(compute_stream), sends_(std::make_shared<PinnedSendPool>()) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  uploaded_ = e;
}

HostStagedCommunicator::~HostStagedCommunicator() {
  // The staging buffer's last copy to the device must be done before it is
  // freed (not while unwinding: the stream may never finish).
  if (std::uncaught_exceptions() == 0) cudaEventSynchronize(static_cast<cudaEvent_t>(uploaded_));
  cudaEventDestroy(static_cast<cudaEvent_t>(uploaded_));
}

char* HostStagedCommunicator::staging(size_t bytes) {
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(uploaded_)));
  if (!staging_ || staging_->size() < bytes) {
    staging_.reset();
    staging_ = std::make_unique<PinnedBytes>(std::max(bytes, size_t{1}));
  }
  return staging_->data();
}

void HostStagedCommunicator::to_device(void* dst, size_t offset, size_t bytes) {
  const auto s = static_cast<cudaStream_t>(compute_);
  CUDA_CHECK(cudaMemcpyAsync(dst, staging_->data() + offset, bytes, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(uploaded_), s));
}

template <class T>
void HostStagedCommunicator::allreduce(T* data, int64_t n) {
  const size_t bytes = sizeof(T) * static_cast<size_t>(n);
  char* host = staging(bytes);
  to_host(host, data, bytes, compute_);
  group_.allreduce_sum(reinterpret_cast<T*>(host), n);
  to_device(data, 0, bytes);
}

void HostStagedCommunicator::allreduce_sum(float* data, int64_t n) { allreduce(data, n); }
void HostStagedCommunicator::allreduce_sum(double* data, int64_t n) { allreduce(data, n); }

void HostStagedCommunicator::allreduce(void* data, int64_t n, Element type, Reduction op) {
  const size_t bytes = element_bytes(type) * static_cast<size_t>(n);
  char* host = staging(bytes);
  to_host(host, data, bytes, compute_);
  group_.allreduce(host, n, type, op);
  to_device(data, 0, bytes);
}

Pending HostStagedCommunicator::start_allreduce_sum(float* data, int64_t n) {
  allreduce(data, n);
  return std::make_unique<ComputeOrdered>(compute_);
}

Pending HostStagedCommunicator::start_reduce_scatter_sum(const void* send, void* recv,
                                                          const std::vector<int64_t>& counts,
                                                          Element type) {
  const auto [before, total] = part_place(counts, rank());
  (void)before;
  // Every part, then this rank's sum (MPI forbids aliasing).
  const size_t all = element_bytes(type) * static_cast<size_t>(total);
  const size_t mine = element_bytes(type) * static_cast<size_t>(counts[rank()]);
  char* host = staging(all + mine);
  to_host(host, send, all, compute_);
  group_.start_reduce_scatter_sum(host, host + all, counts, type)->wait();
  to_device(recv, all, mine);
  return std::make_unique<ComputeOrdered>(compute_);
}

Pending HostStagedCommunicator::start_allgather(const void* send, void* recv,
                                                const std::vector<int64_t>& counts,
                                                size_t elem_bytes) {
  const auto [before, total] = part_place(counts, rank());
  const size_t bytes = elem_bytes * static_cast<size_t>(total);
  char* host = staging(bytes);
  char* mine = host + elem_bytes * static_cast<size_t>(before);
  to_host(mine, send, elem_bytes * static_cast<size_t>(counts[rank()]), compute_);
  group_.start_allgather(mine, host, counts, elem_bytes)->wait();
  to_device(recv, 0, bytes);
  return std::make_unique<ComputeOrdered>(compute_);
}

void HostStagedCommunicator::reduce_scatter(const void* send, void* recv, int64_t part,
                                            Element type) {
  const size_t bytes = element_bytes(type) * static_cast<size_t>(part);
  const size_t parts = bytes * static_cast<size_t>(size());
  char* host = staging(parts + bytes);  // every part, then the result
  to_host(host, send, parts, compute_);
  group_.reduce_scatter(host, host + parts, part, type);
  to_device(recv, parts, bytes);
}

void HostStagedCommunicator::allgather(const void* send, void* recv, int64_t part, Element type) {
  const size_t bytes = element_bytes(type) * static_cast<size_t>(part);
  const size_t all = bytes * static_cast<size_t>(size());
  char* host = staging(all);
  char* mine = host + bytes * static_cast<size_t>(rank());
  to_host(mine, send, bytes, compute_);
  group_.allgather(mine, host, part, type);
  to_device(recv, 0, all);
}

void HostStagedCommunicator::alltoallv_bytes(const void* send,
                                              const std::vector<int64_t>& send_bytes, void* recv,
                                              const std::vector<int64_t>& recv_bytes) {
  int64_t out = 0, in = 0;
  for (const int64_t b : send_bytes) out += b;
  for (const int64_t b : recv_bytes) in += b;
  char* host = staging(static_cast<size_t>(out + in));
  to_host(host, send, static_cast<size_t>(out), compute_);
  group_.alltoallv_bytes(host, send_bytes, host + out, recv_bytes);
  to_device(recv, static_cast<size_t>(out), static_cast<size_t>(in));
}

// Staged through the host, nothing overlaps: done when started.
Pending HostStagedCommunicator::start_allreduce(void* data, int64_t n, Element type) {
  allreduce(data, n, type, Reduction::kSum);
  return std::make_unique<ComputeOrdered>(compute_);
}

Pending HostStagedCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t part,
                                                     Element type) {
  reduce_scatter(send, recv, part, type);
  return std::make_unique<ComputeOrdered>(compute_);
}

Pending HostStagedCommunicator::start_send_bytes(const void* data, size_t bytes, int peer,
                                                 int tag) {
  std::unique_ptr<PinnedBytes> copy = sends_->take(bytes);
  to_host(copy->data(), data, bytes, compute_);
  auto op = std::make_unique<StagedSend>(sends_, std::move(copy), bytes);
  op->start(group_, peer, tag);
  return op;
}

void HostStagedCommunicator::recv_bytes(void* data, size_t bytes, int peer, int tag) {
  char* host = staging(bytes);
  group_.recv_bytes(host, bytes, peer, tag);
  // On the compute stream: after the work queued before this receive (which
  // may still read the buffer), before the work queued after it.
  to_device(data, 0, bytes);
}

// Staged through the host, nothing overlaps: done when started.
Pending HostStagedCommunicator::start_exchange_bytes(const void* send, void* recv, size_t bytes,
                                                     int to, int from, int tag) {
  char* host = staging(2 * bytes);
  to_host(host, send, bytes, compute_);
  group_.start_exchange_bytes(host, host + bytes, bytes, to, from, tag)->wait();
  to_device(recv, bytes, bytes);
  return std::make_unique<ComputeOrdered>(compute_);
}

}  // namespace mpiformer
