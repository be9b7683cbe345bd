#include "train/calibrate_links.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/mpi_check.hpp"
#include "train/calibration_timing.hpp"

namespace mpiformer::calibration {
namespace {

// Least squares of t = a + b x over the points; the ring model's latency
// per step is a / steps, its bandwidth 1 / b.
LinkCost fit(const std::vector<std::pair<double, double>>& xt, double steps) {
  double sx = 0, st = 0, sxx = 0, sxt = 0;
  const double n = static_cast<double>(xt.size());
  for (const auto& [x, t] : xt) sx += x, st += t, sxx += x * x, sxt += x * t;
  const double b = (n * sxt - sx * st) / (n * sxx - sx * sx);
  const double a = (st - b * sx) / n;
  LinkCost c;
  c.latency = std::max(0.0, a / steps);
  c.bandwidth = b > 0 ? 1.0 / b : 1e15;
  return c;
}

}  // namespace

Link measure_link(MPI_Comm raw, double max_bytes, double budget, const LinkTransport& transport) {
  MPI_Comm dup;
  MPI_CHECK(MPI_Comm_dup(raw, &dup));
  MpiCommunicator group(dup);
  std::unique_ptr<Communicator> owned = transport.connect ? transport.connect(group) : nullptr;
  Communicator& comm = owned ? *owned : group;
  const auto fence = transport.fence ? transport.fence : [] {};
  const auto allocate = transport.allocate ? transport.allocate : [](int64_t n) {
    std::shared_ptr<float> p(new float[static_cast<size_t>(n)], std::default_delete<float[]>());
    std::fill(p.get(), p.get() + n, 1.0f);
    return p;
  };
  const int g = comm.size();
  std::vector<double> sizes;
  for (double s = 4096; s <= max_bytes; s *= 8) sizes.push_back(s);
  std::vector<std::pair<double, double>> ar, rs, ag, sr, aa;
  const double part = static_cast<double>(g - 1) / g;
  for (double bytes : sizes) {
    const int64_t n = static_cast<int64_t>(bytes / 4) / g * g;
    const std::shared_ptr<float> buf = allocate(n), recv = allocate(n / g);
    const std::vector<int64_t> counts(static_cast<size_t>(g), n / g);
    auto time = [&](auto&& f) { return seconds_per_call(dup, budget, f, fence); };
    ar.push_back({2 * part * 4 * n, time([&] { comm.allreduce_sum(buf.get(), n); })});
    rs.push_back({part * 4 * n, time([&] {
                    comm.start_reduce_scatter_sum(buf.get(), recv.get(), counts)->wait();
                  })});
    ag.push_back({part * 4 * n, time([&] {
                    comm.start_allgather(buf.get() + comm.rank() * (n / g), buf.get(), counts, 4)->wait();
                  })});
    // Equal blocks to every rank (expert parallelism's exchange): sent from
    // the buffer's first half into its second (MPI's buffers must not overlap).
    const int64_t block = n / 2 / g;
    const std::vector<int64_t> block_bytes(static_cast<size_t>(g), 4 * block);
    aa.push_back({part * 4.0 * static_cast<double>(block * g), time([&] {
                    comm.alltoallv_bytes(buf.get(), block_bytes, buf.get() + block * g, block_bytes);
                  })});
    // Ping-pong between the first two ranks: half the round trip.
    const double rtt = time([&] {
      const size_t b = static_cast<size_t>(4 * n);
      if (comm.rank() == 0) {
        comm.start_send_bytes(buf.get(), b, 1, 7)->wait();
        comm.recv_bytes(buf.get(), b, 1, 8);
      } else if (comm.rank() == 1) {
        comm.recv_bytes(buf.get(), b, 0, 7);
        comm.start_send_bytes(buf.get(), b, 0, 8)->wait();
      }
    });
    // The ranks' mean counts the g - 2 idle ones as zero: ranks 0 and 1's
    // round trip is mean x g / 2, one way half of that.
    sr.push_back({4.0 * n, rtt * g / 2 / 2});
  }
  Link l;
  l.allreduce = fit(ar, 2.0 * (g - 1));
  l.reduce_scatter = fit(rs, g - 1.0);
  l.allgather = fit(ag, g - 1.0);
  l.sendrecv = fit(sr, 1);
  l.alltoall = fit(aa, g - 1.0);
  return l;
}

}  // namespace mpiformer::calibration
