// The stage's tensor group (model/gpt_stage.hpp's TensorGroup) over a
// communicator: its sums, maxima, sequence parallelism's reduce-scatter
// and all-gather, and the started sums backward overlaps with weight
// gradients, each reported to an observer with the bytes this rank sent
// (the ring algorithm's count).
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "model/gpt_stage.hpp"
#include "parallel/communicator.hpp"

namespace mpiformer {

// Told of each collective of the tensor group: which ("tensor all-reduce",
// "tensor all-gather", "tensor reduce-scatter"), when it ran (on a GPU, when the host
// queued it) and the bytes this rank sent; the expert-parallel group's
// exchanges too (train/expert_group.hpp), as kExpertAllToAll, and the
// context group's as kContextRing.
using TensorOpObserver =
    std::function<void(const char* op, std::chrono::steady_clock::time_point start,
                       std::chrono::steady_clock::time_point end, double bytes_sent)>;
inline constexpr char kExpertAllToAll[] = "expert all-to-all";
// And the context group's ring attention (train/context_attention.hpp),
// whose span holds attention's arithmetic as well as its messages.
inline constexpr char kContextRing[] = "context ring attention";
// Within it, each ring step's attention arithmetic (without the waits).
inline constexpr char kContextBlock[] = "context ring block";

// `tp` must outlive the group; `observer` may be empty (the tests).
inline TensorGroup tensor_group(Communicator& tp, const TensorOpObserver* observer = nullptr) {
  using Clock = std::chrono::steady_clock;
  Communicator* comm = &tp;
  // A ring all-reduce of b bytes sends 2 b (g - 1) / g per rank; a
  // reduce-scatter or all-gather of a whole of b bytes, b (g - 1) / g.
  auto report = [observer](const char* op, double bytes_sent, const std::function<void()>& run) {
    const auto t0 = Clock::now();
    run();
    if (observer != nullptr && *observer) (*observer)(op, t0, Clock::now(), bytes_sent);
  };
  auto timed = [comm, report](const char* op, double rounds, int64_t whole, Element type,
                              const std::function<void()>& run) {
    const double g = comm->size();
    report(op,
           rounds * static_cast<double>(whole) * static_cast<double>(element_bytes(type)) *
               (g - 1) / g,
           run);
  };
  auto reduce = [comm, timed](Reduction op) {
    return [comm, timed, op](void* data, int64_t n, Element type) {
      timed("tensor all-reduce", 2, n, type, [&] { comm->allreduce(data, n, type, op); });
    };
  };
  TensorGroup g;
  g.sum = reduce(Reduction::kSum);
  g.max = reduce(Reduction::kMax);
  g.scatter_sum = [comm, timed](const void* whole, void* mine, int64_t part, Element type) {
    timed("tensor reduce-scatter", 1, part * comm->size(), type,
          [&] { comm->reduce_scatter(whole, mine, part, type); });
  };
  g.gather = [comm, timed](const void* mine, void* whole, int64_t part, Element type) {
    timed("tensor all-gather", 1, part * comm->size(), type,
          [&] { comm->allgather(mine, whole, part, type); });
  };
  // Uneven parts (the embedding's token rows): a ring passes on every
  // part but the next rank's, which it receives last.
  g.gather_parts = [comm, report](const void* mine, void* whole,
                                  const std::vector<int64_t>& counts, Element type) {
    int64_t all = 0;
    for (int64_t c : counts) all += c;
    const int64_t next = counts[static_cast<size_t>((comm->rank() + 1) % comm->size())];
    report("tensor all-gather",
           comm->size() > 1 ? static_cast<double>((all - next) * element_bytes(type)) : 0.0,
           [&] { comm->start_allgather(mine, whole, counts, element_bytes(type))->wait(); });
  };
  // Started: what is timed is the wait, the part not hidden behind the
  // compute between (a GPU's NCCL stream runs beside it; host MPI advances
  // mostly inside the wait).
  auto started = [timed](const char* op, double rounds, int64_t whole, Element type,
                         std::shared_ptr<PendingOp> pending) -> TensorGroup::Wait {
    return [=] { timed(op, rounds, whole, type, [&] { pending->wait(); }); };
  };
  g.start_sum = [comm, started](void* data, int64_t n, Element type) {
    return started("tensor all-reduce", 2, n, type, comm->start_allreduce(data, n, type));
  };
  g.start_scatter_sum = [comm, started](const void* whole, void* mine, int64_t part,
                                        Element type) {
    return started("tensor reduce-scatter", 1, part * comm->size(), type,
                   comm->start_reduce_scatter(whole, mine, part, type));
  };
  return g;
}

}  // namespace mpiformer
