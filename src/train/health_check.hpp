// The start's health check ([run] health_check): before the first step,
// every rank's GEMM rate (the back end's peak probe, the one MFU is
// counted against) and the links of the ring in world rank order (a few
// 8 MB exchanges over each link, two ranks at a time) are gathered; a rank
// below [run] health_fraction of the median GEMM rate, or both of whose
// links are below that fraction of the median link, is named with its
// host. One slow link alone names neither end: its two ranks are equally
// suspect (and with two ranks there is one link and no median to fall
// below), so it is reported, and no host is blamed for it.
// At scale one slow GPU or a degraded link paces every collective: named
// at the start, it costs seconds, not the run.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

namespace mpiformer {

struct RankHealth {
  int rank = 0;
  std::string host;
  double gemm_flops = 0;    // FLOP/s
  double link_bytes = 0;    // bytes/s: the slower of its links (0: one rank)
};

// The link between ranks a and b = a + 1 (mod the ranks): the rate of an
// exchange as its slower end timed it.
struct LinkHealth {
  int a = 0, b = 0;
  double bytes = 0;  // bytes/s each way
};

struct HealthVerdict {
  std::vector<RankHealth> ranks;  // every rank's
  std::vector<LinkHealth> links;  // the ring's: none for one rank, one for two
  double median_gemm = 0, median_link = 0;
  std::vector<std::string> below;  // "rank 3 on node12: GEMM 41.0 GFLOP/s, 0.41 of the median"
  std::vector<std::string> below_host;  // each one's host
  std::vector<std::string> hosts;  // the hosts of those ranks, each once
  std::vector<std::string> slow_links;  // a slow link neither of whose ends is named
  std::string line;                // the log's summary
  std::string json;                // {"health": {...}}
};

// The name this rank's node goes by in reports: Slurm's node name where
// the rank runs under Slurm (what --exclude takes; test clusters run
// several nodes on one host), else the host name. Written into
// out[size], cut to fit.
void rank_host(char* out, size_t size);

// The verdict on measured figures: `ranks` (rank, host, gemm_flops) and
// `links` (the ring's, as LinkHealth lays them out). Pure, for tests.
HealthVerdict judge_health(std::vector<RankHealth> ranks, std::vector<LinkHealth> links, double fraction);

// Collective over `world`: measures the ring's links, gathers
// `gemm_flops` (this rank's measured rate) and the links from every rank;
// every rank gets the same verdict (the hosts and lines too).
HealthVerdict check_health(MPI_Comm world, double gemm_flops, double fraction);

}  // namespace mpiformer
