#include "train/straggler_watch.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>

#include "core/format.hpp"
#include "core/mpi_check.hpp"
#include "train/health_check.hpp"

namespace mpiformer {

StragglerWatch::StragglerWatch(MPI_Comm world, int64_t every, double fraction, bool active, int peers)
    : world_(world), every_(active ? every : 0), fraction_(fraction), active_(active) {
  if (every_ <= 0) return;
  MPI_CHECK(MPI_Comm_rank(world_, &rank_));
  MPI_CHECK(MPI_Comm_size(world_, &size_));
  char host[HOST_NAME_MAX + 1] = {};
  rank_host(host, sizeof host);
  std::vector<char> all(static_cast<size_t>(size_) * (HOST_NAME_MAX + 1));
  MPI_CHECK(MPI_Allgather(host, HOST_NAME_MAX + 1, MPI_CHAR, all.data(), HOST_NAME_MAX + 1, MPI_CHAR, world_));
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(&all[static_cast<size_t>(r) * (HOST_NAME_MAX + 1)]);
  slow_windows_.assign(static_cast<size_t>(size_), 0);
  peers_.resize(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Allgather(&peers, 1, MPI_INT, peers_.data(), 1, MPI_INT, world_));
}

void StragglerWatch::step_done(double seconds, const StepTimes& before, const StepTimes& after) {
  if (every_ <= 0) return;
  const double waits = (after.recv_wait - before.recv_wait) + (after.reduce_exposed - before.reduce_exposed) +
                       (after.tp_reduce - before.tp_reduce) + (after.ep_exchange - before.ep_exchange) +
                       (after.cp_ring - after.cp_arithmetic) - (before.cp_ring - before.cp_arithmetic);
  compute_ += std::max(0.0, seconds - waits);
  ++steps_;
}

StragglerWatch::Finding StragglerWatch::window_end(int64_t step) {
  Finding f;
  if (every_ <= 0 || step % every_ != 0 || steps_ == 0) return f;
  const double mine = compute_ / static_cast<double>(steps_);
  compute_ = 0;
  steps_ = 0;
  std::vector<double> all(static_cast<size_t>(size_));
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, world_));
  for (int r = 0; r < size_; ++r) {
    const double t = all[static_cast<size_t>(r)];
    std::vector<double> sorted;
    for (int q = 0; q < size_; ++q)
      if (peers_[static_cast<size_t>(q)] == peers_[static_cast<size_t>(r)]) sorted.push_back(all[static_cast<size_t>(q)]);
    if (sorted.size() < 2) continue;  // a stage of one rank: nothing to compare with
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    int& k = slow_windows_[static_cast<size_t>(r)];
    k = median > 0 && t * fraction_ > median ? k + 1 : 0;
    if (k < 2) continue;  // once may be noise; twice running is a pattern
    f.lines.push_back(strprintf(
        "straggler: rank %d on %s computes %.1f ms a step against the median %.1f ms (%.2fx) over "
        "the last %lld steps, %d windows running",
        r, hosts_[static_cast<size_t>(r)].c_str(), 1e3 * t, 1e3 * median, t / median,
        static_cast<long long>(every_), k));
    f.records.push_back(strprintf(
        "{\"straggler\": {\"step\": %lld, \"rank\": %d, \"host\": %s, \"compute_ms\": %.4g, "
        "\"median_ms\": %.4g, \"windows\": %d}}",
        static_cast<long long>(step), r, json_string(hosts_[static_cast<size_t>(r)]).c_str(), 1e3 * t,
        1e3 * median, k));
  }
  return f;
}

}  // namespace mpiformer
