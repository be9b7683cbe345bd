// A machine file: what the planner prices a step with (`mpiformer plan`).
// Plain TOML that `mpiformer calibrate` writes from measurements, or a
// user writes by hand for a cluster they have not got yet (a datasheet's
// rates: inputs/machines/*.toml). Every problem is an InputError naming
// the file and the key. Units in the file are the ones people quote (GiB,
// TFLOP/s, GB/s, microseconds); in memory everything is SI (bytes,
// FLOP/s, bytes/s, seconds).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/settings.hpp"

namespace mpiformer {

// A collective's cost on one kind of link, as the ring algorithm spends
// it: each of its steps pays `latency`, and the bytes a rank sends go at
// `bandwidth` (bus bandwidth, nccl-tests' busbw).
struct LinkCost {
  double latency = 0;     // s per step
  double bandwidth = 0;   // bytes/s per rank
};
// alltoall: equal blocks, each rank to every other (g - 1 steps, (g - 1) / g
// of the buffer sent per rank; expert parallelism's exchanges); a file
// without it prices it as the all-gather.
struct Link {
  LinkCost allreduce, reduce_scatter, allgather, sendrecv, alltoall;
};

// A measured matmul (Ops::matmul_forward / matmul_backward of m rows, k
// in, n out), seconds per call.
struct MatmulPoint {
  int64_t m = 0, k = 0, n = 0;
  double forward = 0, backward = 0;
};
// One of the output tiles a GPU's GEMM library computes a product in:
// each multiprocessor computes one tile of rows x cols of the output at a
// time, at `rate` of [compute] matmul_tflops (the largest tile's 1: a
// large product's rate). What the planner prices a GEMM's shape with
// where no measured shape is near (plan/gemm_tiles.hpp).
struct MatmulTile {
  int64_t rows = 0, cols = 0;
  double rate = 1;
};
// A measured stage (up to 4 blocks with the embedding and head).
struct StagePoint {
  int64_t n_embd = 0, seq_len = 0, micro_batch = 0;
  int64_t layers = 1;  // blocks of the measured stage (one activation slot)
  Recompute recompute = Recompute::kNone;
  double factor = 1;
  double runtime = 0;  // bytes the process held beyond the stage's accounting
};
// A measured attention (Ops::attention_*), seconds per (batch, head) pair.
struct AttentionPoint {
  int64_t head_size = 0, seq_len = 0;
  double forward = 0, backward = 0;
};

// The non-GEMM kernels' bandwidths measured over buffers of `elements`
// (caches make small buffers faster), bytes/s by kernel rate name.
struct KernelRow {
  double elements = 0;
  std::map<std::string, double> bandwidth;
};

struct MachineSpec {
  std::string path;  // where it was read from ("" if built in memory)
  std::string name;
  Device device = Device::kCpu;  // cpu or cuda
  int devices_per_node = 1;      // GPUs, or (cpu) cores / BLAS threads per rank
  double memory = 0;             // bytes per device (cpu: the node's memory / devices_per_node)
  double peak_flops = 0;         // what MFU is counted against
  double runtime = 0;            // bytes each rank holds beyond the accounting (libraries),
                                 // where no [[compute.stage]] row is near
  // Compute. The precision its rates are of (calibrate measures one; a
  // hand-written file may say): plan refuses decks of another. Unset where
  // a file does not say.
  std::optional<Precision> precision;
  double matmul_flops = 0;     // large matmuls, where the table has no nearer shape
  double attention_flops = 0;  // where the attention table has no nearer shape
  double memory_bandwidth = 0;               // the non-GEMM kernels, unless named below
  // By kernel rate name (model/stage_work.hpp's kernel_rate_name, and
  // "adamw"): size-independent (a datasheet's), or rows by size (measured).
  std::map<std::string, double> kernel_bandwidth;
  std::vector<KernelRow> kernels;
  // A real stage's forward and backward as they run, over the sum of its
  // kernels timed alone (the glue between them, caches a kernel alone does
  // not see), by model shape; calibrate measures them. The nearest shape's
  // applies; 1 where none is near.
  std::vector<StagePoint> stages;
  std::vector<MatmulPoint> matmul;
  // [compute] multiprocessors and matmul_tiles (a hand-written GPU file;
  // 0 and empty where it does not say: every shape at matmul_flops).
  int multiprocessors = 0;
  std::vector<MatmulTile> matmul_tiles;
  std::vector<AttentionPoint> attention;
  // [offload] (optional; 0 where the file does not say): a device's link
  // to page-locked host memory (a GPU's PCIe or NVLink-C2C, each
  // direction); the node's host AdamW (bytes of state it updates a second,
  // 7 floats an element, all its ranks at once: a GPU run's offloaded
  // update runs there); and the node's disk under [train] offload_dir,
  // shared by its ranks. What `plan` prices [train] offload with;
  // calibrate --offload-dir measures the host AdamW and the disk.
  double host_link_bandwidth = 0;
  double host_adamw_bandwidth = 0;
  double disk_read_bandwidth = 0, disk_write_bandwidth = 0;
  // Links within a node, and between nodes (inter unused on one node).
  Link intra, inter;
  bool has_inter = false;
  // The file as TOML (what calibrate writes; reads back the same).
  std::string to_toml() const;
};

MachineSpec load_machine(const std::string& path);
MachineSpec parse_machine(const std::string& text, const std::string& path);

}  // namespace mpiformer
