#include "train/health_check.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/format.hpp"
#include "core/mpi_check.hpp"

namespace mpiformer {

namespace {

// The ring's links: link i joins rank i and rank i + 1 (mod size); two
// ranks have one. Each link is timed alone with its two ranks, a phase at
// a time (links of one phase share no rank: even links, odd links, and
// the closing link of an odd ring by itself), so a rank's slow NIC or
// core shows on its own two links and not on its neighbours'.
int link_count(int size) { return size < 2 ? 0 : size == 2 ? 1 : size; }
int link_phase(int link, int size) { return size % 2 == 1 && link == size - 1 ? 2 : link % 2; }

// This rank's view of its links: the best of six exchanges of 8 MB each
// way, after one to warm up (the best, so a moment's noise on a shared
// node is not a slow link). out[0]: the link to the previous rank, out[1]:
// to the next (0 where there is none).
void time_links(MPI_Comm world, int rank, int size, double out[2]) {
  out[0] = out[1] = 0;
  const int links = link_count(size);
  if (links == 0) return;
  constexpr int kBytes = 8 << 20, kTries = 6;
  std::vector<char> send(kBytes, 1), recv(kBytes);
  const int mine[2] = {(rank + size - 1) % size, rank};  // link indices: to prev, to next
  for (int phase = 0; phase < 3; ++phase) {
    int side = -1;
    for (int k = 0; k < 2; ++k)
      if (mine[k] < links && link_phase(mine[k], size) == phase) side = k;
    const int partner = side == 0 ? (rank + size - 1) % size : (rank + 1) % size;
    for (int i = 0; i <= kTries; ++i) {
      MPI_CHECK(MPI_Barrier(world));
      if (side < 0) continue;
      const auto t0 = std::chrono::steady_clock::now();
      MPI_CHECK(MPI_Sendrecv(send.data(), kBytes, MPI_CHAR, partner, 71, recv.data(), kBytes, MPI_CHAR,
                             partner, 71, world, MPI_STATUS_IGNORE));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0 && s > 0) out[side] = std::max(out[side], kBytes / s);
    }
  }
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

HealthVerdict judge_health(std::vector<RankHealth> ranks, std::vector<LinkHealth> links, double fraction) {
  HealthVerdict v;
  const int size = static_cast<int>(ranks.size());
  std::vector<double> gemm, rates;
  for (const RankHealth& h : ranks) gemm.push_back(h.gemm_flops);
  for (const LinkHealth& l : links) rates.push_back(l.bytes);
  v.median_gemm = median(gemm);
  v.median_link = median(rates);
  const auto slow = [&](const LinkHealth& l) { return v.median_link > 0 && l.bytes < fraction * v.median_link; };
  // A rank's links in `links`: to the previous rank and to the next.
  const auto link_of = [&](int r, int k) -> const LinkHealth* {
    const int i = k == 0 ? (r + size - 1) % size : r;
    return i < static_cast<int>(links.size()) ? &links[static_cast<size_t>(i)] : nullptr;
  };
  std::vector<char> named(static_cast<size_t>(size), 0);
  std::string below_json;
  for (RankHealth& h : ranks) {
    const LinkHealth* prev = link_of(h.rank, 0);
    const LinkHealth* next = link_of(h.rank, 1);
    h.link_bytes = std::min(prev ? prev->bytes : HUGE_VAL, next ? next->bytes : HUGE_VAL);
    if (!prev && !next) h.link_bytes = 0;
    std::string why;
    if (v.median_gemm > 0 && h.gemm_flops < fraction * v.median_gemm)
      why = strprintf("GEMM %.1f GFLOP/s, %.2f of the median", h.gemm_flops / 1e9, h.gemm_flops / v.median_gemm);
    // Both links slow: the rank they share is the likely cause. (Two
    // ranks have one link: prev or next is missing, never both slow.)
    if (prev && next && prev != next && slow(*prev) && slow(*next))
      why += strprintf("%slinks to ranks %d and %d %.2f and %.2f GB/s, %.2f and %.2f of the median",
                       why.empty() ? "" : "; ", prev->a, next->b, prev->bytes / 1e9, next->bytes / 1e9,
                       prev->bytes / v.median_link, next->bytes / v.median_link);
    if (why.empty()) continue;
    named[static_cast<size_t>(h.rank)] = 1;
    v.below.push_back(strprintf("rank %d on %s: %s", h.rank, h.host.c_str(), why.c_str()));
    v.below_host.push_back(h.host);
    if (std::find(v.hosts.begin(), v.hosts.end(), h.host) == v.hosts.end()) v.hosts.push_back(h.host);
    below_json += strprintf("%s{\"rank\": %d, \"host\": %s, \"why\": %s}", below_json.empty() ? "" : ", ",
                            h.rank, json_string(h.host).c_str(), json_string(why).c_str());
  }
  std::string slow_json;
  for (const LinkHealth& l : links) {
    if (!slow(l) || named[static_cast<size_t>(l.a)] || named[static_cast<size_t>(l.b)]) continue;
    const std::string& ha = ranks[static_cast<size_t>(l.a)].host;
    const std::string& hb = ranks[static_cast<size_t>(l.b)].host;
    v.slow_links.push_back(strprintf("link between rank %d on %s and rank %d on %s %.2f GB/s, %.2f of the median",
                                     l.a, ha.c_str(), l.b, hb.c_str(), l.bytes / 1e9, l.bytes / v.median_link));
    slow_json += strprintf("%s{\"ranks\": [%d, %d], \"gbs\": %.6g}", slow_json.empty() ? "" : ", ", l.a, l.b,
                           l.bytes / 1e9);
  }
  const auto [gmin, gmax] = std::minmax_element(gemm.begin(), gemm.end());
  v.line = strprintf("health: %d rank(s): GEMM %.1f-%.1f GFLOP/s (median %.1f)", size, *gmin / 1e9,
                     *gmax / 1e9, v.median_gemm / 1e9);
  if (!rates.empty()) {
    const auto [lmin, lmax] = std::minmax_element(rates.begin(), rates.end());
    v.line += strprintf(", %zu link(s) %.2f-%.2f GB/s (median %.2f)", rates.size(), *lmin / 1e9, *lmax / 1e9,
                        v.median_link / 1e9);
  }
  v.line += v.below.empty() ? strprintf("; every rank within %.2f of the median", fraction)
                            : strprintf("; %zu rank(s) below %.2f of the median", v.below.size(), fraction);
  v.json = strprintf("{\"health\": {\"ranks\": %d, \"gemm_median_gflops\": %.6g, \"link_median_gbs\": %.6g, "
                     "\"fraction\": %.3g, \"below\": [%s], \"slow_links\": [%s]}}",
                     size, v.median_gemm / 1e9, v.median_link / 1e9, fraction, below_json.c_str(),
                     slow_json.c_str());
  v.ranks = std::move(ranks);
  v.links = std::move(links);
  return v;
}

HealthVerdict check_health(MPI_Comm world, double gemm_flops, double fraction) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  double seen[2];
  time_links(world, rank, size, seen);
  char host[HOST_NAME_MAX + 1] = {};
  rank_host(host, sizeof host);
  // Every rank's figures and host, on every rank (a few bytes each).
  double mine[3] = {gemm_flops, seen[0], seen[1]};
  std::vector<double> all(3 * static_cast<size_t>(size));
  MPI_CHECK(MPI_Allgather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, world));
  std::vector<char> hosts(static_cast<size_t>(size) * (HOST_NAME_MAX + 1));
  MPI_CHECK(MPI_Allgather(host, HOST_NAME_MAX + 1, MPI_CHAR, hosts.data(), HOST_NAME_MAX + 1, MPI_CHAR,
                          world));
  std::vector<RankHealth> ranks;
  for (int r = 0; r < size; ++r) {
    RankHealth h;
    h.rank = r;
    h.host = std::string(&hosts[static_cast<size_t>(r) * (HOST_NAME_MAX + 1)]);
    h.gemm_flops = all[3 * static_cast<size_t>(r)];
    ranks.push_back(h);
  }
  // Link i as its slower end timed it: rank i's "next", rank i+1's "prev".
  std::vector<LinkHealth> links;
  for (int i = 0; i < link_count(size); ++i) {
    const int b = (i + 1) % size;
    links.push_back({i, b, std::min(all[3 * static_cast<size_t>(i) + 2], all[3 * static_cast<size_t>(b) + 1])});
  }
  return judge_health(std::move(ranks), std::move(links), fraction);
}

}  // namespace mpiformer
