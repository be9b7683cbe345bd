#include "parallel/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "core/cuda_check.hpp"
#include "core/mpi_check.hpp"
#include "core/nccl_check.hpp"
#include "parallel/mpi_session.hpp"

namespace mpiformer {
namespace {

ncclComm_t nccl(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t cuda(void* s) { return static_cast<cudaStream_t>(s); }

size_t count(int64_t n) {
  MPIFORMER_CHECK(n >= 0, "negative message size");
  return static_cast<size_t>(n);
}

// Completion of an operation on the comm stream. wait() makes the compute
// stream wait for it (no host block); test() asks without waiting.
class CudaEventPending final : public PendingOp {
 public:
  CudaEventPending(cudaStream_t comm, cudaStream_t compute) : compute_(compute) {
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(event_, comm));
  }
  ~CudaEventPending() override {
    if (!waited_) cudaStreamWaitEvent(compute_, event_, 0);
    cudaEventDestroy(event_);  // released by CUDA once the event completes
  }
  void wait() override {
    CUDA_CHECK(cudaStreamWaitEvent(compute_, event_, 0));
    waited_ = true;
  }
  bool test() override { return cudaEventQuery(event_) == cudaSuccess; }
  void order_stream(void* stream) override {
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0));
  }

 private:
  cudaStream_t compute_;
  cudaEvent_t event_ = nullptr;
  bool waited_ = false;
};

}  // namespace

bool group_shares_a_gpu(MpiCommunicator& group) {
  // The PCI bus id names a GPU across processes (ordinals depend on each
  // process's CUDA_VISIBLE_DEVICES); the host name tells nodes apart.
  constexpr int kLen = 64;
  char mine[2 * kLen] = {};
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetPCIBusId(mine, kLen, device));
  int name_len = 0;
  MPI_CHECK(MPI_Get_processor_name(mine + kLen, &name_len));
  std::vector<char> all(static_cast<size_t>(2 * kLen) * group.size());
  MPI_CHECK(MPI_Allgather(mine, 2 * kLen, MPI_CHAR, all.data(), 2 * kLen, MPI_CHAR, group.get()));
  for (int a = 0; a < group.size(); ++a)
    for (int b = a + 1; b < group.size(); ++b)
      if (std::memcmp(&all[a * 2 * kLen], &all[b * 2 * kLen], 2 * kLen) == 0) return true;
  return false;
}

NcclCommunicator::NcclCommunicator(MpiCommunicator& group, void* compute_stream)
    : compute_(compute_stream), rank_(group.rank()), size_(group.size()) {
  ncclUniqueId id{};
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group.get()));
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, size_, id, rank_));
  comm_ = comm;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaEvent_t event = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  event_ = event;
}

NcclCommunicator::~NcclCommunicator() {
  const bool failing = std::uncaught_exceptions() > 0;
  if (failing && comm_ != nullptr) {
    ncclCommAbort(nccl(comm_));  // ends its kernels; nothing is waited for
    comm_ = nullptr;
  }
  if (stream_ != nullptr) {
    if (!failing) cudaStreamSynchronize(cuda(stream_));
    cudaStreamDestroy(cuda(stream_));
  }
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  if (comm_ != nullptr) ncclCommDestroy(nccl(comm_));
}

void NcclCommunicator::check_health() {
  ncclResult_t async = ncclSuccess;
  NCCL_CHECK(ncclCommGetAsyncError(nccl(comm_), &async));
  if (async != ncclSuccess && async != ncclInProgress) {
    throw SystemError("rank " + std::to_string(world_rank()) + ": NCCL failed asynchronously: " +
                      ncclGetErrorString(async) + " (a peer gone or a network error?)");
  }
}

void NcclCommunicator::after_compute() {
  // Recording reuses one event: cudaStreamWaitEvent captures the event's
  // state at the call, so a later record does not disturb this wait.
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), cuda(compute_)));
  CUDA_CHECK(cudaStreamWaitEvent(cuda(stream_), static_cast<cudaEvent_t>(event_), 0));
}

void NcclCommunicator::before_compute() {
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), cuda(stream_)));
  CUDA_CHECK(cudaStreamWaitEvent(cuda(compute_), static_cast<cudaEvent_t>(event_), 0));
}

Pending NcclCommunicator::record() {
  return std::make_unique<CudaEventPending>(cuda(stream_), cuda(compute_));
}

void NcclCommunicator::allreduce_sum(float* data, int64_t n) {
  after_compute();
  NCCL_CHECK(ncclAllReduce(data, data, count(n), ncclFloat, ncclSum, nccl(comm_), cuda(stream_)));
  before_compute();
}

void NcclCommunicator::allreduce_sum(double* data, int64_t n) {
  after_compute();
  NCCL_CHECK(ncclAllReduce(data, data, count(n), ncclDouble, ncclSum, nccl(comm_), cuda(stream_)));
  before_compute();
}

namespace {
ncclDataType_t nccl_type(Element element) {
  return element == Element::kBf16  ? ncclBfloat16
         : element == Element::kF16 ? ncclFloat16
         : element == Element::kF32 ? ncclFloat
                                    : ncclDouble;
}
}  // namespace

void NcclCommunicator::allreduce(void* data, int64_t n, Element element, Reduction op) {
  const ncclDataType_t type = nccl_type(element);
  after_compute();
  NCCL_CHECK(ncclAllReduce(data, data, count(n), type, op == Reduction::kSum ? ncclSum : ncclMax,
                           nccl(comm_), cuda(stream_)));
  before_compute();
}

Pending NcclCommunicator::start_allreduce_sum(float* data, int64_t n) {
  after_compute();
  NCCL_CHECK(ncclAllReduce(data, data, count(n), ncclFloat, ncclSum, nccl(comm_), cuda(stream_)));
  return record();
}

// NCCL's reduce-scatter and all-gather need equal parts; ZeRO's parts end
// at tensor rows, so each part is its own root's reduce or broadcast, all
// in one group (one launch, the same traffic pattern).
Pending NcclCommunicator::start_reduce_scatter_sum(const void* send, void* recv,
                                                   const std::vector<int64_t>& counts,
                                                   Element element) {
  const ncclDataType_t type = nccl_type(element);
  const size_t elem = element_bytes(element);
  after_compute();
  NCCL_CHECK(ncclGroupStart());
  int64_t at = 0;
  for (int r = 0; r < size_; ++r) {
    NCCL_CHECK(ncclReduce(static_cast<const char*>(send) + elem * static_cast<size_t>(at), recv,
                          count(counts[r]), type, ncclSum, r, nccl(comm_), cuda(stream_)));
    at += counts[r];
  }
  NCCL_CHECK(ncclGroupEnd());
  return record();
}

Pending NcclCommunicator::start_allgather(const void* send, void* recv,
                                          const std::vector<int64_t>& counts, size_t elem_bytes) {
  after_compute();
  // Bits, not values: a 2-byte type for bf16 parts.
  const ncclDataType_t type = elem_bytes == 2 ? ncclFloat16 : ncclFloat;
  NCCL_CHECK(ncclGroupStart());
  int64_t at = 0;
  for (int r = 0; r < size_; ++r) {
    void* place = static_cast<char*>(recv) + elem_bytes * static_cast<size_t>(at);
    NCCL_CHECK(ncclBroadcast(r == rank_ ? send : place, place, count(counts[r]), type, r,
                             nccl(comm_), cuda(stream_)));
    at += counts[r];
  }
  NCCL_CHECK(ncclGroupEnd());
  return record();
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, int64_t part, Element type) {
  after_compute();
  NCCL_CHECK(ncclReduceScatter(send, recv, count(part), nccl_type(type), ncclSum, nccl(comm_),
                               cuda(stream_)));
  before_compute();
}

void NcclCommunicator::allgather(const void* send, void* recv, int64_t part, Element type) {
  after_compute();
  NCCL_CHECK(ncclAllGather(send, recv, count(part), nccl_type(type), nccl(comm_), cuda(stream_)));
  before_compute();
}

Pending NcclCommunicator::start_allreduce(void* data, int64_t n, Element type) {
  after_compute();
  NCCL_CHECK(ncclAllReduce(data, data, count(n), nccl_type(type), ncclSum, nccl(comm_),
                           cuda(stream_)));
  return record();
}

Pending NcclCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t part,
                                               Element type) {
  after_compute();
  NCCL_CHECK(ncclReduceScatter(send, recv, count(part), nccl_type(type), ncclSum, nccl(comm_),
                               cuda(stream_)));
  return record();
}

// One NCCL group of a send and a receive per peer (itself included: NCCL
// copies that pair locally), so no pair waits on another.
void NcclCommunicator::alltoallv_bytes(const void* send, const std::vector<int64_t>& send_bytes,
                                       void* recv, const std::vector<int64_t>& recv_bytes) {
  MPIFORMER_CHECK(static_cast<int>(send_bytes.size()) == size_ &&
                      static_cast<int>(recv_bytes.size()) == size_,
                  "alltoallv: a size per rank");
  after_compute();
  NCCL_CHECK(ncclGroupStart());
  size_t s_at = 0, r_at = 0;
  for (int r = 0; r < size_; ++r) {
    const size_t out = count(send_bytes[r]), in = count(recv_bytes[r]);
    if (out > 0)
      NCCL_CHECK(ncclSend(static_cast<const char*>(send) + s_at, out, ncclUint8, r, nccl(comm_),
                          cuda(stream_)));
    if (in > 0)
      NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + r_at, in, ncclUint8, r, nccl(comm_),
                          cuda(stream_)));
    s_at += out;
    r_at += in;
  }
  NCCL_CHECK(ncclGroupEnd());
  before_compute();
}

Pending NcclCommunicator::start_send_bytes(const void* data, size_t bytes, int peer, int) {
  after_compute();
  NCCL_CHECK(ncclSend(data, bytes, ncclUint8, peer, nccl(comm_), cuda(stream_)));
  return record();
}

void NcclCommunicator::recv_bytes(void* data, size_t bytes, int peer, int) {
  after_compute();
  NCCL_CHECK(ncclRecv(data, bytes, ncclUint8, peer, nccl(comm_), cuda(stream_)));
  before_compute();
}

Pending NcclCommunicator::start_exchange_bytes(const void* send, void* recv, size_t bytes, int to,
                                               int from, int) {
  after_compute();
  NCCL_CHECK(ncclGroupStart());
  NCCL_CHECK(ncclSend(send, bytes, ncclUint8, to, nccl(comm_), cuda(stream_)));
  NCCL_CHECK(ncclRecv(recv, bytes, ncclUint8, from, nccl(comm_), cuda(stream_)));
  NCCL_CHECK(ncclGroupEnd());
  return record();
}

}  // namespace mpiformer
