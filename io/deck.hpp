// The input deck: a TOML file validated against a fixed schema, plus
// command-line overrides (--set section.key=value). Every problem is an
// InputError naming the file (or the override) and the key.
//
// Every default is the member initialiser below, and only there; the
// README's table is tested against it (tests/unit/test_deck.cpp). Keys
// without a fixed default say how it is derived.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/settings.hpp"
#include "core/gpt_config.hpp"

namespace mpiformer {

// fp16's loss scale: a fixed one, or the dynamic one's floor, at least
// 2^-8; the dynamic one grows to 2^24 at most, and a fixed one is at most
// that. Outside, a sane model's scaled fp16 gradients are all zero or all
// infinite.
constexpr double kMinFixedLossScale = 0x1p-8, kMaxLossScale = 0x1p24;

struct TrainConfig {
  int64_t steps = 0;
  int64_t global_batch = 0;  // sequences per optimizer step, all ranks together
  int64_t micro_batch = 0;   // sequences per micro-batch per rank
  double lr = 0;
  double min_lr = -1;  // not given: lr / 10
  int64_t warmup_steps = 0;
  double weight_decay = 0, grad_clip = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  int64_t seed = 1337;
  int64_t log_every = 1, eval_every = 0, eval_batches = 4;
  int64_t stop_at = 0;  // end this run after this step (0: run to `steps`)
  Precision precision = Precision::kFp32;  // checkpoints stay fp32 either way
  // fp16 only. loss_scale: "dynamic" (0 here: GradScaler's rule, starting
  // at 2^16, train/loss_scaler.hpp) or a fixed scale > 0. Dynamic: the
  // scale doubles after loss_scale_window steps without overflow; a step
  // that overflows is skipped and halves it; below min_loss_scale the run
  // stops.
  double loss_scale = 0;
  int64_t loss_scale_window = 2000;
  double min_loss_scale = 1;
  // A step whose loss or gradient norm is not finite: stop the run (nothing
  // of it applied or saved) or skip its update.
  NonfinitePolicy nonfinite = NonfinitePolicy::kStop;
  // Skip the update of a step whose loss or gradient norm is this many
  // standard deviations above its recent mean (0: off).
  double spike_zscore = 0;
  // Consecutive skipped updates after which the run stops.
  int64_t skip_limit = 10;
  // Activations recomputed in backward instead of kept (bit-identical).
  Recompute recompute = Recompute::kNone;
  // Where the optimizer state lives (core/settings.hpp); nvme needs
  // offload_dir, a node-local directory that exists.
  Offload offload = Offload::kNone;
  std::string offload_dir;
  // MiB of each moment per block of the streamed update (read ahead and
  // written behind, three blocks in host memory per moment): 16 is large
  // enough for a disk's full rate and little beside the state.
  double offload_block_mb = 16;
  // The data-parallel reduction's gradients on the wire, with error
  // feedback (core/settings.hpp); zero 0 only.
  GradCompression grad_compression = GradCompression::kNone;
  // The gradients' accumulation and reduction type (core/settings.hpp);
  // bf16 needs precision bf16 and zero >= 1.
  GradDtype grad_dtype = GradDtype::kFp32;
};

struct CheckpointConfig {
  std::string dir;        // not given: <run.dir>/checkpoints
  int64_t every = 0;      // steps between checkpoints (0: only the final one)
  int64_t keep = 3;       // newest complete checkpoints kept (0: all)
  // A checkpoint when the run reaches its last step (false: benchmarks,
  // whose state nobody resumes; a stop for a requeue still writes one).
  bool at_end = true;
  // Saves on the way (every) write their tensors from a snapshot in a
  // thread while training goes on; the last save, and one before a stop,
  // are synchronous.
  bool async = false;
  // A synchronous save's read-back: while training waits, or beside it
  // ("background": the file is published once every rank's read-back
  // matches, as a background save's is; the last save and a stop's read
  // back inline).
  ReadBack read_back = ReadBack::kInline;
  // The mean time between failures the user expects of the job's nodes
  // (hours; 0: not given): the run prints the checkpoint interval its own
  // save cost suggests for it (Young and Daly).
  double mtbf_hours = 0;
  // "auto" | "never" | a checkpoint path (resume_path).
  ResumeMode resume = ResumeMode::kAuto;
  std::string resume_path;
};

// One source of a blend ([[data.source]]): a dataset (a file or a glob),
// its share of the training samples, and optionally its own validation set.
struct DataSource {
  std::string name;  // in logs and metrics; default: from the path
  std::string path;
  double weight = 1;
  std::string val;
};

struct DataConfig {
  // [data] train alone (one source), or [[data.source]] (a weighted blend);
  // exactly one of the two.
  std::string train, val;
  std::vector<DataSource> sources;
  // A resume whose blend differs from the checkpoint's is refused unless
  // this is set: then the new blend applies from the checkpoint's position.
  bool reblend = false;
  // plan and the run's log warn when a source will be seen more epochs
  // than this over the run.
  int64_t warn_repeats = 4;
  // Attention causal within each document only, and positions (learned or
  // rotary) restarting at each document's start (Llama 3's training);
  // false: windows are plain sequences (GPT-2's, Megatron's default).
  bool document_mask = false;
  // Not a key: the share of causal attention's key-query pairs the mask
  // keeps, measured from the data (DataFeeder::attention_kept) where the
  // planner prices a GPU's attention, which skips what the mask hides.
  double attention_kept = 1;
  // The label of datasets that carry none (Megatron .bin/.idx, llm.c
  // shards): 0 and "" take GPT-2's (token_dataset.hpp's DataLabel).
  int64_t vocab_size = 0;
  std::string tokenizer;
};

struct ParallelConfig {
  // dp x pp x tp ranks; tp is Megatron's tensor parallelism within each
  // block (ranks laid out tp fastest: parallel/process_grid.hpp).
  int64_t dp = 1, pp = 1, tp = 1;
  // Expert parallelism: each sparse layer's experts divided over ep ranks
  // of the data-parallel group (dividing dp), the tokens sent to their
  // experts' ranks and back (model/gpt_stage.hpp's ExpertGroup); each
  // expert's gradients reduced over the dp / ep ranks holding it.
  int64_t ep = 1;
  // Context parallelism: each data-parallel replica's sequences split over
  // cp ranks, two chunks each (head and tail, for the causal mask's
  // balance), attention a ring across them (train/ring_attention.hpp).
  // The cp ranks hold the same parameters: their gradients are summed,
  // and ZeRO shards, over all dp x cp replicas. Ranks: dp x pp x tp x cp.
  int64_t cp = 1;
  // Which two chunks of each sequence a context rank holds
  // (common/context_chunks.hpp): head-tail balances the causal work.
  ContextChunks cp_chunks = ContextChunks::kHeadTail;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  // Model chunks per pipeline rank (schedule "interleaved": v >= 2 chunks
  // of n_layer / (pp v) layers each, rank s holding chunks s, s + pp, ...;
  // 1 for every other schedule).
  int64_t virtual_stages = 1;
  double bucket_mb = 25;          // data-parallel gradient bucket size, MiB (zero 0)
  // ZeRO stage over each stage's data-parallel group: 1 shards the AdamW
  // moments and master weights, 2 also the gradients, 3 also the blocks'
  // weights (see train/zero_shards.hpp).
  int64_t zero = 0;
  // Megatron's sequence parallelism (tp > 1): LayerNorms, residual adds
  // and the residual stream on a tp-th of each micro-batch's rows,
  // all-gathers and reduce-scatters instead of the tensor group's
  // all-reduces (model/gpt_stage.hpp's TensorGroup).
  bool sequence_parallel = false;
  // Let the planner pick dp, pp, tp, ep, zero, schedule, [train]
  // micro_batch and recompute for the job's ranks, priced by [run] machine
  // (the fastest layout that fits; plan/layout_search.hpp). The deck's
  // values are then ignored.
  bool auto_layout = false;
  // What the planner prices a Mixture of Experts' busiest expert-parallel
  // rank at: its experts' rows over their fair share (>= 1; 0: the
  // capacity factor, the most any expert takes, or 1 where routing is
  // dropless). A run's expert_load_max (one expert's) bounds it above.
  double expert_imbalance = 0;
  // The share of each device's memory the planner (plan, [parallel] auto)
  // leaves free: fragmentation, a library's workspace that grows, a
  // neighbour's process. Its layouts fit in the rest.
  double memory_margin = 0.1;
};

struct RunSection {
  std::string dir = "runs/default";
  // kCuda: GPUs (cuda build), kCpu: the host kernels, kAuto: a GPU when
  // the build has CUDA and this node has a GPU, the host otherwise.
  Device device = Device::kAuto;
  double peak_tflops = 0;   // 0: measured at start with a large sgemm
  int64_t blas_threads = 0; // 0: the BLAS library's default
  bool trace = false;       // Chrome trace per rank: <dir>/trace-rank<N>.json
  double time_limit = 0;    // seconds this run may take (0: none; see SLURM_JOB_END_TIME)
  // Seconds one phase (an action of a step, an evaluation) may last before
  // the watchdog ends the job (0: automatic, see train/watchdog.hpp).
  double watchdog_s = 0;
  // A machine file (mpiformer calibrate) for [parallel] auto.
  std::string machine;
  // The start's probe of every rank (train/health_check.hpp): a rank whose
  // GEMM rate or link is below health_fraction of the median is named;
  // health_action says whether the run goes on.
  HealthCheck health_check = HealthCheck::kAuto;
  double health_fraction = 0.8;
  HealthAction health_action = HealthAction::kWarn;
  // Every this many steps the ranks' compute times are compared
  // (train/straggler_watch.hpp; 0: never).
  int64_t straggler_every = 50;
};

struct Deck {
  std::string path;
  GptConfig model;  // vocab_size 0 means "take it from the dataset"
  // [model] init: pretrained weights a fresh run starts from (a Hugging Face
  // GPT-2 directory or .safetensors, an llm.c parameter file, or an
  // mpiformer checkpoint's weights); "" for GPT-2's random initialisation.
  std::string model_init;
  // [model] ffn_multiple_of: Llama's default ffn_hidden is rounded up to it
  // (read only to resolve ffn_hidden, which the resolved deck then gives).
  int64_t ffn_multiple_of = 256;
  // The [model] keys the deck (or --set) gave: where init's file supplies
  // the rest, a key given must agree with it.
  std::set<std::string> model_keys;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  RunSection run;
  CheckpointConfig checkpoint;

  // The ranks holding each stage's parameters (dp x cp): the gradients'
  // reduction and ZeRO's shards span them.
  int64_t replicas() const { return parallel.dp * parallel.cp; }
  // Every rank of the job.
  int64_t ranks() const { return replicas() * parallel.pp * parallel.tp; }
  // Micro-batches each rank runs per optimizer step (gradient accumulation).
  int64_t grad_accum() const { return train.global_batch / (parallel.dp * train.micro_batch); }
  // The resolved deck as TOML, every key with its final value.
  std::string to_toml() const;
};

// The schema's keys and the default each takes, as the resolved deck would
// show it (empty where the default is derived or absent), for the
// documentation and its test.
struct DeckKey {
  std::string section, name;
  bool required;
  std::string default_value;
};
std::vector<DeckKey> deck_keys();

// A deck larger than this is refused before it is parsed (a garbage file
// of 100 MB would otherwise take a minute to be refused).
constexpr uint64_t kMaxDeckBytes = 1 << 20;

// With [model] init: the model's keys the deck omits are taken from the
// weights file and those it gives are checked against it (an InputError
// naming the key and the file), then the deck's relations are checked
// (parse_deck leaves them for here). Call after rebase_relative_paths.
void resolve_model_init(Deck& d);

// A Mixture of Experts' experts over all its sparse layers: at most 65 536
// (each is tensors of the parameter table); InputError(file, field).
void check_expert_count(const GptConfig& cfg, const std::string& file, const std::string& field);
// A model shape read from a file (weights, a checkpoint's attributes) held
// to the deck's limits for the same [model] keys, and check_expert_count,
// before anything is sized from it: InputError(file, "<field_prefix><key>",
// ...) otherwise. A value of 0 is "the file does not say" and passes.
void check_model_limits(const GptConfig& cfg, const std::string& file,
                        const std::string& field_prefix);
// A model shape another tool's file gives (a Hugging Face config.json), held
// to every limit the deck holds the same [model] keys to, 0 and NaN
// included: `fields` pairs each [model] key with the file's name for it,
// which InputError(file, that name, ...) names.
void check_imported_model(const GptConfig& cfg, const std::string& file,
                          const std::vector<std::pair<std::string, std::string>>& fields);

// Reads and validates `path`, then applies `overrides` ("section.key=value",
// value in TOML syntax; a bare word is taken as a string).
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides);
// The two halves of load_deck, so that one rank can read the file and
// every rank parse the same text: the file's bytes (a regular file of at
// most kMaxDeckBytes), and their validation. `what` names the file in
// messages (a machine file is read the same way).
std::string read_deck_text(const std::string& path, const char* what = "input deck");
Deck parse_deck(const std::string& text, const std::string& path,
                const std::vector<std::string>& overrides);
// Makes the deck's relative paths relative to `base` (a rank whose working
// directory differs from the one that read the deck).
void rebase_relative_paths(Deck& d, const std::string& base);

}  // namespace mpiformer
