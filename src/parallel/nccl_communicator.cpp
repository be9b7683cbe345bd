#include "parallel/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <climits>

#include "cuda/cuda_check.hpp"
#include "parallel/mpi_check.hpp"

#define NCCL_CHECK(call)                                                          \
  do {                                                                            \
    const ncclResult_t mpiformer_nr_ = (call);                                    \
    if (mpiformer_nr_ != ncclSuccess)                                             \
      ::mpiformer::throw_system_error(#call, __FILE__, __LINE__,                  \
                                      "rank " + std::to_string(world_rank()) + ": " + \
                                          ncclGetErrorString(mpiformer_nr_));     \
  } while (0)

namespace mpiformer {
namespace {

ncclComm_t nccl(void* c) { return static_cast<ncclComm_t>(c); }
cudaStream_t cuda(void* s) { return static_cast<cudaStream_t>(s); }

size_t count(int64_t n) {
  MPIFORMER_CHECK(n >= 0, "negative message size");
  return static_cast<size_t>(n);
}

class CudaEventPending final : public PendingOp {
 public:
  explicit CudaEventPending(cudaStream_t stream) {
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~CudaEventPending() override {
    cudaEventSynchronize(event_);
    cudaEventDestroy(event_);
  }
  void wait() override { CUDA_CHECK(cudaEventSynchronize(event_)); }
  bool test() override { return cudaEventQuery(event_) == cudaSuccess; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

int select_local_device() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 0;
  MPI_CHECK(MPI_Comm_rank(node, &local));
  MPI_CHECK(MPI_Comm_free(&node));
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  MPIFORMER_CHECK(devices > 0, "no CUDA device on this node");
  const int device = local % devices;
  CUDA_CHECK(cudaSetDevice(device));
  return device;
}

NcclCommunicator::NcclCommunicator(MpiCommunicator& group)
    : rank_(group.rank()), size_(group.size()) {
  ncclUniqueId id{};
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, group.get()));
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, size_, id, rank_));
  comm_ = comm;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
}

NcclCommunicator::~NcclCommunicator() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(cuda(stream_));
    cudaStreamDestroy(cuda(stream_));
  }
  if (comm_ != nullptr) ncclCommDestroy(nccl(comm_));
}

Pending NcclCommunicator::record() { return std::make_unique<CudaEventPending>(cuda(stream_)); }

void NcclCommunicator::allreduce_sum(float* data, int64_t n) {
  NCCL_CHECK(ncclAllReduce(data, data, count(n), ncclFloat, ncclSum, nccl(comm_), cuda(stream_)));
  CUDA_CHECK(cudaStreamSynchronize(cuda(stream_)));
}

void NcclCommunicator::allreduce_sum(double* data, int64_t n) {
  NCCL_CHECK(ncclAllReduce(data, data, count(n), ncclDouble, ncclSum, nccl(comm_), cuda(stream_)));
  CUDA_CHECK(cudaStreamSynchronize(cuda(stream_)));
}

Pending NcclCommunicator::start_allreduce_sum(float* data, int64_t n) {
  NCCL_CHECK(ncclAllReduce(data, data, count(n), ncclFloat, ncclSum, nccl(comm_), cuda(stream_)));
  return record();
}

Pending NcclCommunicator::start_send(const float* data, int64_t n, int peer, int) {
  // A group of one: NCCL then schedules the send without blocking the host,
  // so a neighbour that sends to us at the same time cannot deadlock.
  NCCL_CHECK(ncclGroupStart());
  NCCL_CHECK(ncclSend(data, count(n), ncclFloat, peer, nccl(comm_), cuda(stream_)));
  NCCL_CHECK(ncclGroupEnd());
  return record();
}

void NcclCommunicator::recv(float* data, int64_t n, int peer, int) {
  NCCL_CHECK(ncclGroupStart());
  NCCL_CHECK(ncclRecv(data, count(n), ncclFloat, peer, nccl(comm_), cuda(stream_)));
  NCCL_CHECK(ncclGroupEnd());
  CUDA_CHECK(cudaStreamSynchronize(cuda(stream_)));
}

void NcclCommunicator::broadcast(float* data, int64_t n, int root) {
  NCCL_CHECK(ncclBroadcast(data, data, count(n), ncclFloat, root, nccl(comm_), cuda(stream_)));
  CUDA_CHECK(cudaStreamSynchronize(cuda(stream_)));
}

}  // namespace mpiformer
