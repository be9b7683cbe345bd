// `mpiformer calibrate --offload-dir DIR`: what [train] offload's update
// runs on. The node's host AdamW: every rank of the first node at once
// updating a state of the run's block size many times over with the
// host's threaded kernel (a GPU run's offloaded update runs there),
// [offload] host_adamw_gbs. And the disk under DIR as [train]
// offload = "nvme" streams it. Every rank of the first node at once (a
// run's ranks stream their moments together), each writing and then
// reading a file through io/offload_files.hpp's path (direct I/O where the
// file system allows it, blocks of the run's default size, read ahead and
// written behind by the same thread pool). The node's rates go to the
// machine file's [offload] disk_read_gbs and disk_write_gbs.
#pragma once
#include <string>

#include "machine_file.hpp"

namespace mpiformer::calibration {

// Collective over MPI_COMM_WORLD; the same rates on every rank. InputError
// naming DIR and `calibrate --offload-dir` where it is missing, unwritable
// or without room for `bytes_per_rank` per rank.
void measure_offload_disk(const std::string& dir, double bytes_per_rank, MachineSpec& m);
// Collective over MPI_COMM_WORLD; the same rate on every rank.
void measure_host_adamw(MachineSpec& m);

}  // namespace mpiformer::calibration
