// The input deck: a TOML file validated against a fixed schema, plus
// command-line overrides (--set section.key=value). Every problem is an
// InputError naming the file (or the override) and the key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt_config.hpp"

namespace mpiformer {

struct TrainConfig {
  int64_t steps = 0;
  int64_t global_batch = 0;  // sequences per optimizer step, all ranks together
  int64_t micro_batch = 0;   // sequences per micro-batch per rank
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0;
  double weight_decay = 0, grad_clip = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  int64_t seed = 0;
  int64_t log_every = 1, eval_every = 0, eval_batches = 1;
  int64_t stop_at = 0;  // end this run after this step (0: run to `steps`)
  // "fp32", or "bf16": bf16 activations and matmul inputs with float
  // accumulation, master weights and moments (GPU only; checkpoints stay fp32).
  std::string precision = "fp32";
};

struct CheckpointConfig {
  std::string dir;        // default: <run.dir>/checkpoints
  int64_t every = 0;      // steps between checkpoints (0: only the final one)
  int64_t keep = 3;       // newest complete checkpoints kept (0: all)
  std::string resume = "auto";  // "auto" | "never" | a checkpoint path
};

struct DataConfig {
  std::string train, val;
};

struct ParallelConfig {
  int64_t dp = 1, pp = 1;
  std::string schedule = "1f1b";  // pipeline schedule: "1f1b" or "gpipe"
  double bucket_mb = 25;          // data-parallel gradient bucket size, MiB
};

struct RunSection {
  std::string dir;
  // "cuda": GPUs (cuda build), "cpu": the host kernels, "auto": a GPU when
  // the build has CUDA and this node has a GPU, the host otherwise.
  std::string device = "auto";
  double peak_tflops = 0;   // 0: measured at start with a large sgemm
  int64_t blas_threads = 0; // 0: the BLAS library's default
  bool trace = false;       // Chrome trace per rank: <dir>/trace-rank<N>.json
  double time_limit = 0;    // seconds this run may take (0: none; see SLURM_JOB_END_TIME)
};

struct Deck {
  std::string path;
  GptConfig model;  // vocab_size 0 means "take it from the dataset"
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  RunSection run;
  CheckpointConfig checkpoint;

  // Micro-batches each rank runs per optimizer step (gradient accumulation).
  int64_t grad_accum() const { return train.global_batch / (parallel.dp * train.micro_batch); }
  // The resolved deck as TOML, every key with its final value.
  std::string to_toml() const;
};

// Reads and validates `path`, then applies `overrides` ("section.key=value",
// value in TOML syntax; a bare word is taken as a string).
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace mpiformer
