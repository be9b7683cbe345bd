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
// The host back end's kernels and MPI are what it measures (a GPU's
// cuBLAS/NCCL calibration is not written yet: no GPU to check it on).
#pragma once
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
  std::string name;
};

// Collective over MPI_COMM_WORLD; every rank returns the same file.
MachineSpec calibrate_machine(const CalibrationRequest& request);

}  // namespace mpiformer
