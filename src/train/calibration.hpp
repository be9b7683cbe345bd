// `mpiformer calibrate`: a machine file measured on this machine, under
// the job's launcher (every rank measures at once, as a run computes):
//  - matmuls (the stage's Ops::matmul_forward/backward) at the shapes of
//    the given decks' models, for each tensor-parallel width and a range
//    of micro-batches (rows), as a table the planner interpolates;
//  - attention per (batch, head) at each model's sequence and head size;
//  - the non-GEMM kernels' bandwidth (layernorm, GELU, residual,
//    cross-entropy, embedding, AdamW) over buffers of each model's sizes;
//  - what a rank holds beyond the accounting: a real stage of each model
//    run forward and backward (and its deck's data reader opened), the
//    resident growth not in the stage's accounting (BLAS buffers, HDF5);
//    the stage's time against its kernels' sum is its stage factor;
//  - all-reduce, reduce-scatter, all-gather and send/recv over the ranks
//    of one node, and over one rank per node when the job spans several,
//    at sizes from a few KB to the models' gradients, fitted to the ring
//    model's latency and bus bandwidth.
// On the host back end it measures the host kernels and MPI. On a GPU
// (--device cuda, or auto on a node with one) it measures what a GPU run
// uses: the stage's matmuls through cuBLASLt, attention and the non-GEMM
// kernels on the device in the run's precision (bf16 by default), the bf16
// and fp32 GEMM peaks, the device's memory, and the links through NCCL on
// device buffers; a GPU stage's runtime memory (context, cuBLAS, NCCL)
// from the device's own count. The measurement code is the host's, over
// the other op set (calibrate_kernels.hpp, calibrate_links.hpp).
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "deck.hpp"
#include "machine_file.hpp"

namespace mpiformer {

struct CalibrationRequest {
  std::vector<GptConfig> models;  // shapes to cover (their decks' models)
  std::vector<int64_t> batches;   // each model's global batch (the largest rows measured)
  std::vector<int64_t> micro_batches;  // each model's micro-batch (the stage probe's)
  // The decks themselves where given (their data readers' memory is
  // measured too, where the data can be read); empty for built-in shapes.
  std::vector<Deck> decks;
  // A file name calibrate may write (and removes) to measure a checkpoint
  // save's buffers; "" to skip that.
  std::string scratch;
  int max_tp = 1;                 // tensor-parallel widths up to this
  double seconds = 0.05;          // timing budget of each point
  // The largest micro-batch, in tokens, at which a whole stage is run to
  // measure its factor and runtime memory (a deck's own micro-batch is
  // always run): larger micro-batches are priced from the nearest measured.
  double probe_tokens = 2048;
  std::string name;
  Device device = Device::kCpu;   // resolved: kCpu or kCuda
  Precision precision = Precision::kFp32;  // of the rates: the kernels of that precision
};

// Collective over MPI_COMM_WORLD; every rank returns the same file.
MachineSpec calibrate_machine(const CalibrationRequest& request);

namespace calibration {
// The GPU's measurements (cuda build): `node` holds this node's ranks.
MachineSpec calibrate_gpu(const CalibrationRequest& request, MPI_Comm node, int node_rank);
}  // namespace calibration

}  // namespace mpiformer
