// The subcommands of the mpiformer executable. Each returns the process exit
// code and throws InputError for anything the user must fix.
#pragma once
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "core/error.hpp"  // the exit codes

namespace mpiformer {

// A failure of one rank past set-up: says it, naming the rank, and ends
// the job: exit 2 for bad input that rank met alone (a damaged shard), 74
// (kExitStorage) for an output it could not write, 3 for anything else (a
// library call, a dead peer). With more than
// one rank it aborts every rank at once (MPI_Abort), before anything is
// unwound: a rank that drained its streams or destroyed its communicators
// first could wait for a peer that will never answer.
int fail(const std::exception& e, int rank, int world);

struct TrainArgs {
  std::string deck;
  std::vector<std::string> overrides;
};
int run_train(const TrainArgs& args, int rank, int world);

struct PrepArgs {
  std::string tokenizer = "byte";  // byte | gpt2 | sentencepiece
  std::string tokenizer_model;     // sentencepiece: the .model file
  std::string format = "hdf5";  // hdf5 | megatron (OUT.bin + OUT.idx)
  std::string vocab_dir;
  double val_fraction = 0.0;
  std::string jsonl_field = "text";  // JSON lines: the field holding each document's text
  bool skip_bad_lines = false;       // JSON lines that are not documents: counted, not fatal
  std::string output;
  std::vector<std::string> inputs;
};
int run_prep(const PrepArgs& args, int rank);
// Where `prep` writes the validation split for output path `out`.
std::string val_output_path(const std::string& out);

struct InspectArgs {
  std::vector<std::string> files;
  int tokens = 32;
};
int run_inspect(const InspectArgs& args, int rank);
int inspect_checkpoint(const std::string& path);

struct GenerateArgs {
  std::string checkpoint;
  std::string prompt;
  int tokens = 100;
  double temperature = 1.0;
  int top_k = 0;
  uint64_t seed = 1337;
  std::string vocab_dir;
  std::string tokenizer_model;  // a SentencePiece checkpoint's model file
  std::string logits;  // where to write each step's logits (float32 rows), if given
};
int run_generate(const GenerateArgs& args, int rank);

struct ExportArgs {
  std::string checkpoint;
  std::string format = "hf";  // hf | llmc
  std::string dtype = "fp32";  // fp32 | bf16
  std::string output;
  double max_shard_mb = 5000;  // hf: larger models go in shards with an index
};
int run_export(const ExportArgs& args, int rank);

struct PlanArgs {
  std::string deck;
  std::vector<std::string> overrides;
  std::string machine;
  int ranks = 0;
  int ranks_per_node = 0;  // 0: the machine's devices per node
  int top = 10;
  bool as_given = false;   // price the deck's own layout only
  bool json = false;
  std::string explain;     // write the first layout's predicted timeline here
  std::string memory_margin;  // "" or the deck's [parallel] memory_margin, overridden
};
int run_plan(const PlanArgs& args, int rank);

struct CalibrateArgs {
  std::vector<std::string> decks;  // models whose shapes to measure
  std::string output = "machine.toml";
  std::string name = "this machine";
  int max_tp = 1;
  double seconds = 0.05;
  double probe_tokens = 2048;    // CalibrationRequest's
  std::string device = "auto";   // auto | cpu | cuda
  std::string precision;         // fp32 | bf16 | fp16; "" = bf16 on a GPU, fp32 on the host
  std::string offload_dir;       // "" = the disk is not measured
  double offload_mb = 1024;      // MB each rank writes and reads there
};
int run_calibrate(const CalibrateArgs& args, int rank);

}  // namespace mpiformer
