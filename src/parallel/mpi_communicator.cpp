#include "parallel/mpi_communicator.hpp"

#include <climits>

#include "core/mpi_check.hpp"

namespace mpiformer {
namespace {

// MPI counts are int; every buffer the trainer moves is far below 2^31
// elements, and this says so loudly if a model ever grows past it.
int count(int64_t n) {
  MPIFORMER_CHECK(n >= 0 && n <= INT_MAX, "message of " + std::to_string(n) + " elements");
  return static_cast<int>(n);
}

class MpiPending final : public PendingOp {
 public:
  MpiPending() = default;
  ~MpiPending() override {
    if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  MPI_Request* request() { return &req_; }
  void wait() override { MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE)); }
  bool test() override {
    int done = 0;
    MPI_CHECK(MPI_Test(&req_, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  if (comm_ == MPI_COMM_NULL) return;
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce_sum(float* data, int64_t n) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, comm_));
}

void MpiCommunicator::allreduce_sum(double* data, int64_t n) {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count(n), MPI_DOUBLE, MPI_SUM, comm_));
}

Pending MpiCommunicator::start_allreduce_sum(float* data, int64_t n) {
  auto p = std::make_unique<MpiPending>();
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, comm_, p->request()));
  return p;
}

Pending MpiCommunicator::start_send_bytes(const void* data, size_t bytes, int peer, int tag) {
  auto p = std::make_unique<MpiPending>();
  MPI_CHECK(MPI_Isend(data, count(static_cast<int64_t>(bytes)), MPI_BYTE, peer, tag, comm_,
                      p->request()));
  return p;
}

void MpiCommunicator::recv_bytes(void* data, size_t bytes, int peer, int tag) {
  MPI_CHECK(MPI_Recv(data, count(static_cast<int64_t>(bytes)), MPI_BYTE, peer, tag, comm_,
                     MPI_STATUS_IGNORE));
}

}  // namespace mpiformer
