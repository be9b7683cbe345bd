#include "parallel/mpi_communicator.hpp"

#include "core/bf16.hpp"
#include "core/fp16.hpp"

#include <climits>
#include <cstring>
#include <list>
#include <stdexcept>
#include <vector>

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
  // Counts (or, with offsets, their running sums) as MPI's ints, kept
  // alive with the request.
  std::vector<int>& ints(const std::vector<int64_t>& counts, bool offsets) {
    arrays_.emplace_back();
    int64_t at = 0;
    for (int64_t n : counts) {
      arrays_.back().push_back(count(offsets ? at : n));
      at += n;
    }
    return arrays_.back();
  }
  // On completion, `n` floats move from `from` to `to` (an in-place
  // reduce-scatter's sum, which MPI puts at the buffer's start).
  void move_when_done(const void* from, void* to, size_t bytes) { move_ = {from, to, bytes}; }
  void wait() override {
    MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
    done();
  }
  bool test() override {
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag != 0) done();
    return flag != 0;
  }

 private:
  void done() {
    if (move_.bytes > 0 && move_.from != move_.to) std::memmove(move_.to, move_.from, move_.bytes);
    move_.bytes = 0;
  }
  struct Move {
    const void* from = nullptr;
    void* to = nullptr;
    size_t bytes = 0;
  };
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::list<std::vector<int>> arrays_;  // stable addresses
  Move move_;
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

void MpiCommunicator::allreduce(void* data, int64_t n, Element type, Reduction op) {
  const MPI_Op mpi_op = op == Reduction::kSum ? MPI_SUM : MPI_MAX;
  if (type == Element::kF32 || type == Element::kF64) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count(n),
                            type == Element::kF32 ? MPI_FLOAT : MPI_DOUBLE, mpi_op, comm_));
    return;
  }
  // MPI has no 16-bit floats: reduced in float, rounded once, so every
  // rank rounds the same sums to the same bits.
  float* wide = widen(data, n, type);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, wide, count(n), MPI_FLOAT, mpi_op, comm_));
  narrow(data, wide, n, type);
}

namespace {
void widen_into(float* wide, const void* data, int64_t n, Element type) {
  const auto* bits = static_cast<const uint16_t*>(data);
  const bool bf16 = type == Element::kBf16;
  for (int64_t i = 0; i < n; ++i) wide[i] = bf16 ? bf16_to_float(bits[i]) : fp16_to_float(bits[i]);
}
}  // namespace

float* MpiCommunicator::widen(const void* data, int64_t n, Element type) {
  if (wide_.size() < static_cast<size_t>(n)) wide_.resize(static_cast<size_t>(n));
  widen_into(wide_.data(), data, n, type);
  return wide_.data();
}

float* MpiCommunicator::widen_started(const void* data, int64_t n, Element type) {
  if (started_busy_)
    throw std::logic_error("MpiCommunicator: a 16-bit sum started while another is in flight");
  if (started_wide_.size() < static_cast<size_t>(n)) started_wide_.resize(static_cast<size_t>(n));
  widen_into(started_wide_.data(), data, n, type);
  started_busy_ = true;
  return started_wide_.data();
}

void MpiCommunicator::narrow(void* data, const float* wide, int64_t n, Element type) {
  auto* bits = static_cast<uint16_t*>(data);
  const bool bf16 = type == Element::kBf16;
  for (int64_t i = 0; i < n; ++i) bits[i] = bf16 ? float_to_bf16(wide[i]) : float_to_fp16(wide[i]);
}

namespace {
// The MPI type that moves an element's bits (16-bit ones as integers).
MPI_Datatype bits_type(Element type) {
  return type == Element::kF64 ? MPI_DOUBLE : type == Element::kF32 ? MPI_FLOAT : MPI_UINT16_T;
}
}  // namespace

void MpiCommunicator::reduce_scatter(const void* send, void* recv, int64_t part, Element type) {
  if (type == Element::kF32 || type == Element::kF64) {
    MPI_CHECK(MPI_Reduce_scatter_block(send, recv, count(part), bits_type(type), MPI_SUM, comm_));
    return;
  }
  // In place on the widened parts: the sum of this rank's part lands at
  // their start.
  float* wide = widen(send, part * size_, type);
  MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, wide, count(part), MPI_FLOAT, MPI_SUM, comm_));
  narrow(recv, wide, part, type);
}

namespace {
// A started 16-bit sum: widened into the communicator's started buffer,
// the first `count` rounded into `out` when waited for; the buffer is free
// again then.
class WidePending final : public PendingOp {
 public:
  WidePending(float* wide, bool* busy, void* out, int64_t count, Element type)
      : wide_(wide), busy_(busy), out_(out), count_(count), type_(type) {}
  ~WidePending() override {
    if (done_) return;
    MPI_Wait(&req_, MPI_STATUS_IGNORE);  // never abandoned in flight
    *busy_ = false;
  }
  MPI_Request* request() { return &req_; }
  float* wide() { return wide_; }
  void wait() override {
    if (done_) return;
    MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag != 0) finish();
    return done_;
  }

 private:
  void finish() {
    MpiCommunicator::narrow(out_, wide_, count_, type_);
    done_ = true;
    *busy_ = false;
  }
  float* wide_;
  bool* busy_;
  void* out_;
  int64_t count_;
  Element type_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool done_ = false;
};
}  // namespace

Pending MpiCommunicator::start_allreduce(void* data, int64_t n, Element type) {
  if (type == Element::kF32 || type == Element::kF64) {
    auto p = std::make_unique<MpiPending>();
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), bits_type(type), MPI_SUM, comm_,
                             p->request()));
    return p;
  }
  auto p =
      std::make_unique<WidePending>(widen_started(data, n, type), &started_busy_, data, n, type);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p->wide(), count(n), MPI_FLOAT, MPI_SUM, comm_,
                           p->request()));
  return p;
}

Pending MpiCommunicator::start_reduce_scatter(const void* send, void* recv, int64_t part,
                                              Element type) {
  if (type == Element::kF32 || type == Element::kF64) {
    auto p = std::make_unique<MpiPending>();
    MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, count(part), bits_type(type), MPI_SUM, comm_,
                                        p->request()));
    return p;
  }
  // In place on the widened parts: this rank's sum lands at their start.
  auto p = std::make_unique<WidePending>(widen_started(send, part * size_, type), &started_busy_,
                                         recv, part, type);
  MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, p->wide(), count(part), MPI_FLOAT, MPI_SUM,
                                      comm_, p->request()));
  return p;
}

void MpiCommunicator::allgather(const void* send, void* recv, int64_t part, Element type) {
  const char* mine = static_cast<char*>(recv) + element_bytes(type) * static_cast<size_t>(part * rank_);
  MPI_CHECK(MPI_Allgather(send == mine ? MPI_IN_PLACE : send, count(part), bits_type(type), recv,
                          count(part), bits_type(type), comm_));
}

Pending MpiCommunicator::start_allreduce_sum(float* data, int64_t n) {
  auto p = std::make_unique<MpiPending>();
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), MPI_FLOAT, MPI_SUM, comm_, p->request()));
  return p;
}

namespace {
// The element type MPI moves for an all-gather part (bits, not values;
// 8 bytes: the host's double stage, in the tests).
MPI_Datatype element_type(size_t elem_bytes) {
  MPIFORMER_CHECK(elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8,
                  "element of " + std::to_string(elem_bytes) + " bytes");
  return elem_bytes == 2 ? MPI_UINT16_T : elem_bytes == 4 ? MPI_UINT32_T : MPI_UINT64_T;
}
}  // namespace

namespace {
// MPI has no 16-bit floats: a reduce-scatter of them moves their bits
// (MPI_UINT16_T) under these operations, which add each pair in float and
// round the sum once, as NCCL's 16-bit sums do, so 16 bits travel.
template <uint16_t (*Round)(float), float (*Widen)(uint16_t)>
void add_16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Round(Widen(a[i]) + Widen(b[i]));
}
// The 16-bit sums, created once after MPI_Init (the first 16-bit
// reduce-scatter) and freed at MPI_Finalize: it deletes MPI_COMM_SELF's
// attributes first (MPI 4.0, 11.2.4), and this one's callback frees them.
MPI_Op sum_ops[2] = {MPI_OP_NULL, MPI_OP_NULL};  // bf16, fp16
int free_sum_ops(MPI_Comm, int, void*, void*) {
  for (MPI_Op& op : sum_ops)
    if (op != MPI_OP_NULL) MPI_Op_free(&op);
  return MPI_SUCCESS;
}
MPI_Op sum_op(Element type) {
  if (type == Element::kF32) return MPI_SUM;
  MPI_Op& op = sum_ops[type == Element::kBf16 ? 0 : 1];
  if (op == MPI_OP_NULL) {
    if (sum_ops[0] == MPI_OP_NULL && sum_ops[1] == MPI_OP_NULL) {
      int key = MPI_KEYVAL_INVALID;
      MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_sum_ops, &key, nullptr));
      MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr));
    }
    MPI_CHECK(MPI_Op_create(type == Element::kBf16 ? &add_16<float_to_bf16, bf16_to_float>
                                                   : &add_16<float_to_fp16, fp16_to_float>,
                            1, &op));
  }
  return op;
}
}  // namespace

Pending MpiCommunicator::start_reduce_scatter_sum(const void* send, void* recv,
                                                  const std::vector<int64_t>& counts,
                                                  Element type) {
  MPIFORMER_CHECK(type != Element::kF64, "a reduce-scatter of doubles");
  const MPI_Datatype bits = bits_type(type);
  const MPI_Op op = sum_op(type);
  const size_t elem = element_bytes(type);
  // Non-blocking collectives may keep the count array: it lives in the op.
  auto p = std::make_unique<MpiPending>();
  auto& c = p->ints(counts, false);
  int64_t mine = 0;
  for (int r = 0; r < rank_; ++r) mine += counts[r];
  char* all = static_cast<char*>(recv) - elem * static_cast<size_t>(mine);
  if (all == static_cast<const char*>(send)) {
    // In place: MPI forbids aliased buffers, so the whole buffer is the
    // input and the sum lands at its start, then moves to this rank's part.
    MPI_CHECK(MPI_Ireduce_scatter(MPI_IN_PLACE, all, c.data(), bits, op, comm_, p->request()));
    p->move_when_done(all, recv, elem * static_cast<size_t>(counts[rank_]));
    return p;
  }
  MPI_CHECK(MPI_Ireduce_scatter(send, recv, c.data(), bits, op, comm_, p->request()));
  return p;
}

Pending MpiCommunicator::start_allgather(const void* send, void* recv,
                                         const std::vector<int64_t>& counts, size_t elem_bytes) {
  auto p = std::make_unique<MpiPending>();
  auto& c = p->ints(counts, false);
  auto& displs = p->ints(counts, true);
  char* mine = static_cast<char*>(recv) + elem_bytes * static_cast<size_t>(displs[rank_]);
  const MPI_Datatype type = element_type(elem_bytes);
  MPI_CHECK(MPI_Iallgatherv(send == mine ? MPI_IN_PLACE : send, c[rank_], type, recv, c.data(),
                            displs.data(), type, comm_, p->request()));
  return p;
}

void MpiCommunicator::alltoallv_bytes(const void* send, const std::vector<int64_t>& send_bytes,
                                      void* recv, const std::vector<int64_t>& recv_bytes) {
  MPIFORMER_CHECK(static_cast<int>(send_bytes.size()) == size_ &&
                      static_cast<int>(recv_bytes.size()) == size_,
                  "alltoallv: a size per rank");
  std::vector<int> sc, sd, rc, rd;
  int64_t s_at = 0, r_at = 0;
  for (int r = 0; r < size_; ++r) {
    sc.push_back(count(send_bytes[r]));
    sd.push_back(count(s_at));
    rc.push_back(count(recv_bytes[r]));
    rd.push_back(count(r_at));
    s_at += send_bytes[r];
    r_at += recv_bytes[r];
  }
  MPI_CHECK(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                          MPI_BYTE, comm_));
}

std::vector<int64_t> exchange_counts(MpiCommunicator& group, const std::vector<int64_t>& counts) {
  MPIFORMER_CHECK(static_cast<int>(counts.size()) == group.size(), "exchange_counts: a count per rank");
  std::vector<int64_t> out(counts.size());
  MPI_CHECK(MPI_Alltoall(counts.data(), 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, group.get()));
  return out;
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

Pending MpiCommunicator::start_exchange_bytes(const void* send, void* recv, size_t bytes, int to,
                                              int from, int tag) {
  // The receive first: a peer's message then lands in place.
  auto in = std::make_unique<MpiPending>();
  MPI_CHECK(MPI_Irecv(recv, count(static_cast<int64_t>(bytes)), MPI_BYTE, from, tag, comm_,
                      in->request()));
  Pending out = start_send_bytes(send, bytes, to, tag);
  return std::make_unique<PendingPair>(std::move(in), std::move(out));
}

}  // namespace mpiformer
