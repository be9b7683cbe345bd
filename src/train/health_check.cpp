#include "train/health_check.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/format.hpp"
#include "core/mpi_check.hpp"

namespace mpiformer {

namespace {

// The link's rate: the best of six exchanges of 8 MB with the ring's
// next rank (sent) and previous rank (received), after one to warm up
// (the best, so a moment's noise on a shared node is not a slow link).
double link_rate(MPI_Comm world, int rank, int size) {
  if (size < 2) return 0;
  constexpr int kBytes = 8 << 20, kTries = 6;
  std::vector<char> out(kBytes, 1), in(kBytes);
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  double best = 0;
  for (int i = 0; i <= kTries; ++i) {
    MPI_CHECK(MPI_Barrier(world));
    const auto t0 = std::chrono::steady_clock::now();
    MPI_CHECK(MPI_Sendrecv(out.data(), kBytes, MPI_CHAR, next, 71, in.data(), kBytes, MPI_CHAR, prev,
                           71, world, MPI_STATUS_IGNORE));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0 && s > 0) best = std::max(best, kBytes / s);
  }
  return best;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void rank_host(char* out, size_t size) {
  if (size == 0) return;
  const char* slurm = std::getenv("SLURMD_NODENAME");
  if (slurm != nullptr && *slurm != '\0') {
    std::snprintf(out, size, "%s", slurm);
    return;
  }
  if (::gethostname(out, size - 1) != 0) std::snprintf(out, size, "unknown");
  out[size - 1] = '\0';
}

HealthVerdict check_health(MPI_Comm world, double gemm_flops, double fraction) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  const double link = link_rate(world, rank, size);
  char host[HOST_NAME_MAX + 1] = {};
  rank_host(host, sizeof host);
  // Every rank's figures and host, on every rank (a few bytes each).
  double mine[2] = {gemm_flops, link};
  std::vector<double> all(2 * static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, world));
  std::vector<char> hosts(static_cast<size_t>(size) * (HOST_NAME_MAX + 1));
  MPI_CHECK(MPI_Allgather(host, HOST_NAME_MAX + 1, MPI_CHAR, hosts.data(), HOST_NAME_MAX + 1, MPI_CHAR,
                          world));
  HealthVerdict v;
  std::vector<double> gemm, links;
  for (int r = 0; r < size; ++r) {
    RankHealth h;
    h.rank = r;
    h.host = std::string(&hosts[static_cast<size_t>(r) * (HOST_NAME_MAX + 1)]);
    h.gemm_flops = all[2 * static_cast<size_t>(r)];
    h.link_bytes = all[2 * static_cast<size_t>(r) + 1];
    gemm.push_back(h.gemm_flops);
    links.push_back(h.link_bytes);
    v.ranks.push_back(h);
  }
  v.median_gemm = median(gemm);
  v.median_link = median(links);
  std::string below_json;
  for (const RankHealth& h : v.ranks) {
    std::string why;
    if (v.median_gemm > 0 && h.gemm_flops < fraction * v.median_gemm)
      why = strprintf("GEMM %.1f GFLOP/s, %.2f of the median", h.gemm_flops / 1e9, h.gemm_flops / v.median_gemm);
    if (v.median_link > 0 && h.link_bytes < fraction * v.median_link)
      why += strprintf("%slink to rank %d %.2f GB/s, %.2f of the median", why.empty() ? "" : "; ",
                       (h.rank + 1) % size, h.link_bytes / 1e9, h.link_bytes / v.median_link);
    if (why.empty()) continue;
    v.below.push_back(strprintf("rank %d on %s: %s", h.rank, h.host.c_str(), why.c_str()));
    v.below_host.push_back(h.host);
    if (std::find(v.hosts.begin(), v.hosts.end(), h.host) == v.hosts.end()) v.hosts.push_back(h.host);
    below_json += strprintf("%s{\"rank\": %d, \"host\": %s, \"why\": %s}", below_json.empty() ? "" : ", ",
                            h.rank, json_string(h.host).c_str(), json_string(why).c_str());
  }
  const auto [gmin, gmax] = std::minmax_element(gemm.begin(), gemm.end());
  const auto [lmin, lmax] = std::minmax_element(links.begin(), links.end());
  v.line = strprintf("health: %d rank(s): GEMM %.1f-%.1f GFLOP/s (median %.1f)", size, *gmin / 1e9,
                     *gmax / 1e9, v.median_gemm / 1e9);
  if (size > 1)
    v.line += strprintf(", links %.2f-%.2f GB/s (median %.2f)", *lmin / 1e9, *lmax / 1e9, v.median_link / 1e9);
  v.line += v.below.empty() ? strprintf("; every rank within %.2f of the median", fraction)
                            : strprintf("; %zu rank(s) below %.2f of the median", v.below.size(), fraction);
  v.json = strprintf("{\"health\": {\"ranks\": %d, \"gemm_median_gflops\": %.6g, \"link_median_gbs\": %.6g, "
                     "\"fraction\": %.3g, \"below\": [%s]}}",
                     size, v.median_gemm / 1e9, v.median_link / 1e9, fraction, below_json.c_str());
  return v;
}

}  // namespace mpiformer
