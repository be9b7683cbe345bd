// The start's health check ([run] health_check): before the first step,
// every rank's GEMM rate (the back end's peak probe, the one MFU is
// counted against) and its link (a few 8 MB exchanges with its ring
// neighbours in world rank order) are gathered; a rank below
// [run] health_fraction of the median of either is named with its host.
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
  double link_bytes = 0;    // bytes/s to the next rank (0: one rank)
};

struct HealthVerdict {
  std::vector<RankHealth> ranks;  // rank 0 only: every rank's
  double median_gemm = 0, median_link = 0;
  std::vector<std::string> below;  // "rank 3 on node12: GEMM 41.0 GFLOP/s, 0.41 of the median"
  std::vector<std::string> below_host;  // each one's host
  std::vector<std::string> hosts;  // the hosts of those ranks, each once
  std::string line;                // the log's summary
  std::string json;                // {"health": {...}}
};

// The name this rank's node goes by in reports: Slurm's node name where
// the rank runs under Slurm (what --exclude takes; test clusters run
// several nodes on one host), else the host name. Written into
// out[size], cut to fit.
void rank_host(char* out, size_t size);

// Collective over `world`: measures this rank's link, gathers
// `gemm_flops` (this rank's measured rate) and the link from every rank;
// every rank gets the same verdict (the hosts and lines too).
HealthVerdict check_health(MPI_Comm world, double gemm_flops, double fraction);

}  // namespace mpiformer
