// mpiformer: train GPT-2-style transformers on MPI clusters.
// The same binary runs standalone, under mpirun and under srun (MPI is
// started where a command needs it: main below). Errors in input are
// reported once, by rank 0, and every rank exits non-zero; any other failure
// aborts the whole job.
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/exit_cleanup.hpp"
#include "parallel/mpi_session.hpp"
#include "parallel/nccl_version.hpp"

namespace mpiformer {

// A number option's range: CLI11's Range lets NaN through (every
// comparison with it is false); NaN and infinities are outside every range.
// A number in [lo, hi] (`whole`: a whole one); the message says what was
// given ("abc", "2.5", "nan"), where CLI11's own range check calls any of
// them "not in range".
CLI::Validator number_in(double lo, double hi, bool whole) {
  const std::string kind = whole ? "a whole number" : "a number";
  const auto show = [whole](double x) {
    return whole ? std::to_string(static_cast<long long>(x)) : CLI::detail::to_string(x);
  };
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(text, &used);
          if (used != text.size() || (whole && v != std::floor(v)))
            return "expected " + kind + ", got " + text;
        } catch (const std::exception&) {
          return "expected " + kind + ", got " + text;
        }
        if (!std::isfinite(v) || v < lo || v > hi)
          return "expected " + kind + " in [" + show(lo) + ", " + show(hi) + "], got " + text;
        return {};
      },
      std::string(whole ? "INT" : "FLOAT") + " in [" + show(lo) + " - " + show(hi) + "]");
}
CLI::Validator finite_range(double lo, double hi) { return number_in(lo, hi, false); }
CLI::Validator whole_range(long long lo, long long hi) {
  return number_in(static_cast<double>(lo), static_cast<double>(hi), true);
}

int fail(const std::exception& e, int rank, int world) {
  // Bad input one rank met alone (a token out of range in the window it
  // read): still bad input, exit 2, which the job scripts never restart.
  const bool input = dynamic_cast<const InputError*>(&e) != nullptr;
  const bool storage = dynamic_cast<const StorageError*>(&e) != nullptr;
  const bool restart = dynamic_cast<const RestartableError*>(&e) != nullptr;
  if (input) {
    std::fprintf(stderr, "mpiformer: error (met by rank %d): %s\n", rank, e.what());
  } else {
    std::fprintf(stderr, "mpiformer: fatal on rank %d: %s%s\n", rank, e.what(),
                 storage ? " (an output could not be written: free space or fix the file "
                           "system, then run again to resume; exit 74)"
                 : restart ? " (the last published checkpoint is intact: a restart resumes "
                             "from it; exit 75, which the job scripts requeue)"
                           : "");
  }
  std::fflush(stderr);
  remove_registered_files();  // MPI_Abort runs no destructor
  const int code = input     ? kExitInputError
                   : storage ? kExitStorage
                   : restart ? kExitRequeue
                             : kExitFailure;
  if (world > 1) MpiSession::abort(code);
  return code;
}

// Whether a launcher (mpirun/mpiexec, srun, a Cray or MVAPICH launcher)
// started this process as one rank of a job: each sets one of these.
bool launched_as_a_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                           "SLURM_PROCID", "MV2_COMM_WORLD_RANK", "PALS_RANKID"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace mpiformer

int main(int argc, char** argv) {
  using namespace mpiformer;
  // A rank of a launched job starts MPI at once: every rank parses alike and
  // rank 0 alone reports. Run by hand, the commands that only read and
  // print (inspect, generate, export, plan) never start MPI: an MPI
  // singleton starts a daemon first (half a second here), and on a login
  // node MPI may not start at all. train, prep and calibrate start it once
  // the command line is read.
  std::optional<MpiSession> mpi;
  if (launched_as_a_rank()) mpi.emplace(&argc, &argv);
  const auto rank = [&] { return mpi ? mpi->rank() : 0; };
  const auto world = [&] { return mpi ? mpi->size() : 1; };
  // After MPI (its threads then see the binding MPI gives the rank); torn
  // down before it.
  std::optional<Kokkos::ScopeGuard> kokkos;

  CLI::App app{"mpiformer: GPT training with data and pipeline parallelism over MPI", "mpiformer"};
#ifdef MPIFORMER_HAVE_CUDA
  const std::string backends = "back ends: cpu, cuda; NCCL " + nccl_version();
#else
  const std::string backends = "back ends: cpu";
#endif
  app.set_version_flag("--version", std::string("mpiformer ") + MPIFORMER_VERSION + " (" +
                                        backends + ")");
  app.require_subcommand(1);

  TrainArgs train;
  auto* t = app.add_subcommand("train", "train a model described by an input deck (TOML)");
  t->add_option("deck", train.deck, "input deck, e.g. inputs/tiny.toml")->required();
  t->add_option("--set", train.overrides,
                "override a deck key: section.key=value (TOML value; repeatable)");

  PrepArgs prep;
  auto* p = app.add_subcommand("prep", "tokenize text into an HDF5 token dataset (every rank of "
                                       "an mpirun takes a share)");
  p->add_option("--tokenizer", prep.tokenizer,
                "byte, gpt2, or sentencepiece (a SentencePiece model, Llama 2's kind: "
                "--tokenizer-model)")
      ->check(CLI::IsMember({"byte", "gpt2", "sentencepiece"}))
      ->capture_default_str();
  p->add_option("--tokenizer-model", prep.tokenizer_model,
                "the SentencePiece model file (spm_train's .model) for --tokenizer sentencepiece");
  p->add_option("--vocab-dir", prep.vocab_dir,
                "directory with GPT-2's encoder.json and vocab.bpe (default: inputs/gpt2 of "
                "the source tree)");
  p->add_option("--val-fraction", prep.val_fraction,
                "fraction of tokens (taken from the end) written to OUT_val.h5")
      ->check(finite_range(0.0, 0.5))
      ->capture_default_str();
  p->add_option("--jsonl-field", prep.jsonl_field,
                "JSON lines inputs (.jsonl, .ndjson, compressed or not): the field holding "
                "each line's document text")
      ->capture_default_str();
  p->add_flag("--skip-bad-lines", prep.skip_bad_lines,
              "JSON lines that are not an object with that string field: count them and go on "
              "(default: stop, naming the file and line)");
  p->add_option("--format", prep.format,
                "hdf5, or megatron: Megatron-LM's indexed dataset, OUT.bin and OUT.idx, one "
                "document per text file")
      ->check(CLI::IsMember({"hdf5", "megatron"}))
      ->capture_default_str();
  p->add_option("--output,-o", prep.output, "output file (.h5; .bin for megatron)")->required();
  p->add_option("text", prep.inputs,
                "inputs: text files (one document each) or JSON lines (one document a line), "
                "plain or gzip/zstd-compressed")
      ->required();

  InspectArgs inspect;
  auto* i = app.add_subcommand("inspect", "summarise a token dataset or a checkpoint");
  i->add_option("files", inspect.files,
                "token datasets (.h5 or llm.c .bin) or checkpoints; each is checked in turn, "
                "exit 2 if any fails")
      ->required();
  i->add_option("--tokens", inspect.tokens, "how many leading tokens to show")
      ->check(whole_range(0, 1 << 30))
      ->capture_default_str();

  GenerateArgs gen;
  auto* g = app.add_subcommand("generate", "sample text from a checkpoint");
  g->add_option("checkpoint", gen.checkpoint, "checkpoint file (step_*.h5)")->required();
  g->add_option("--prompt", gen.prompt, "text to continue");
  g->add_option("--tokens", gen.tokens, "tokens to generate")->check(whole_range(0, 1 << 20))->capture_default_str();
  g->add_option("--temperature", gen.temperature, "0: greedy (argmax)")
      ->check(finite_range(0.0, 100.0))
      ->capture_default_str();
  g->add_option("--top-k", gen.top_k, "sample among the k most likely (0: all)")
      ->check(whole_range(0, 1 << 24))
      ->capture_default_str();
  g->add_option("--seed", gen.seed, "sampling seed")->capture_default_str();
  g->add_option("--vocab-dir", gen.vocab_dir, "GPT-2 tokenizer files (default: inputs/gpt2)");
  g->add_option("--tokenizer-model", gen.tokenizer_model,
                "the SentencePiece model a checkpoint's data was tokenized with");
  g->add_option("--logits", gen.logits,
                "write the logits each new token is drawn from to this file (float32, "
                "vocab_size a row)");

  ExportArgs exp;
  auto* x = app.add_subcommand("export", "write a checkpoint's weights for Hugging Face or llm.c");
  x->add_option("checkpoint", exp.checkpoint, "checkpoint file (step_*.h5)")->required();
  x->add_option("--format", exp.format,
                "hf: a directory from_pretrained loads (GPT2LMHeadModel or LlamaForCausalLM: "
                "safetensors, config.json); llmc: llm.c's gpt2_*.bin parameter file (GPT-2)")
      ->check(CLI::IsMember({"hf", "llmc"}))
      ->capture_default_str();
  x->add_option("--dtype", exp.dtype, "fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  x->add_option("--output,-o", exp.output, "the directory (hf) or file (llmc) to create")->required();
  x->add_option("--max-shard-mb", exp.max_shard_mb,
                "hf: largest safetensors file; a larger model is written in shards with "
                "model.safetensors.index.json, as save_pretrained does")
      ->check(finite_range(0.001, 1e9))
      ->capture_default_str();

  PlanArgs plan;
  auto* pl = app.add_subcommand("plan", "predict memory, step time and bubble of every layout "
                                        "of a deck on N ranks, fastest first");
  pl->add_option("deck", plan.deck, "input deck")->required();
  pl->add_option("--set", plan.overrides, "override a deck key: section.key=value (repeatable)");
  pl->add_option("--machine", plan.machine,
                 "machine file (mpiformer calibrate writes one; inputs/machines/ has others)")
      ->required();
  pl->add_option("--ranks", plan.ranks, "ranks to plan for")->check(whole_range(1, 1 << 24));
  pl->add_option("--ranks-per-node", plan.ranks_per_node,
                 "ranks on each node (default: the machine's devices per node; more share them)")
      ->check(whole_range(1, 1 << 20));
  pl->add_option("--top", plan.top, "layouts shown")->check(whole_range(1, 1 << 20))->capture_default_str();
  pl->add_option("--memory-margin", plan.memory_margin,
                 "share of each device's memory to leave free (the deck's [parallel] "
                 "memory_margin, 0.1 by default; 0 to 0.9)")
      ->check(finite_range(0.0, 0.9));
  pl->add_flag("--as-given", plan.as_given, "price the deck's own layout only");
  pl->add_flag("--json", plan.json, "print JSON instead of the table");
  pl->add_option("--explain", plan.explain,
                 "write the first layout's predicted timeline here (Chrome trace, to set beside "
                 "a run's trace-rank*.json)");

  CalibrateArgs cal;
  auto* ca = app.add_subcommand("calibrate", "measure this machine's kernels and links into a "
                                             "machine file (launch as the job would: mpirun/srun)");
  ca->add_option("decks", cal.decks, "decks whose models' shapes to measure (default: tiny and "
                                     "GPT-2 small)");
  ca->add_option("--output,-o", cal.output, "machine file to write")->capture_default_str();
  ca->add_option("--name", cal.name, "the machine's name in the file")->capture_default_str();
  ca->add_option("--max-tp", cal.max_tp, "measure matmul shapes for tensor-parallel widths up to this")
      ->check(whole_range(1, 1024))
      ->capture_default_str();
  ca->add_option("--seconds", cal.seconds,
                 "timing budget per measured point (longer: steadier rates, a longer calibration)")
      ->check(finite_range(0.001, 10.0))
      ->capture_default_str();
  ca->add_option("--probe-tokens", cal.probe_tokens,
                 "largest micro-batch, in tokens, at which a whole stage is run to measure its "
                 "factor and runtime memory (a deck's own is always run; larger: the planner "
                 "measures rather than extrapolates big micro-batches, and calibration takes "
                 "longer, about a minute per 4096 tokens of GPT-2 small on 2 cores)")
      ->check(finite_range(1.0, 1e9))
      ->capture_default_str();
  ca->add_option("--device", cal.device, "what to measure: the GPU (cuda), the host back end "
                                         "(cpu), or a GPU where this node has one (auto)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  ca->add_option("--precision", cal.precision, "precision of the measured rates (default: bf16 on "
                                               "a GPU, fp32 on the host)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  ca->add_option("--offload-dir", cal.offload_dir,
                 "also measure what [train] offload runs on, every rank of a node at once: "
                 "the disk under this directory as offload = \"nvme\" streams it ([offload] "
                 "disk_read_gbs, disk_write_gbs) and the host's AdamW (host_adamw_gbs; a GPU "
                 "calibration measures it and the GPU's host link always)");
  ca->add_option("--offload-mb", cal.offload_mb, "MB each rank writes and reads under --offload-dir")
      ->check(finite_range(16.0, 1e7))
      ->capture_default_str();

  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      const int rc = rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : kExitInputError);
      return rc == 0 ? 0 : kExitInputError;
    }
    if (!mpi && (t->parsed() || p->parsed() || ca->parsed())) mpi.emplace(&argc, &argv);
    // Kokkos never sees the program's arguments: it would print its own
    // help for --help and could take options meant for us. It still reads
    // its environment variables (KOKKOS_NUM_THREADS, ...).
    kokkos.emplace(Kokkos::InitArguments{});
    if (t->parsed()) return run_train(train, rank(), world());
    if (p->parsed()) return run_prep(prep, rank());
    if (i->parsed()) return run_inspect(inspect, rank());
    if (g->parsed()) return run_generate(gen, rank());
    if (x->parsed()) return run_export(exp, rank());
    if (pl->parsed()) return run_plan(plan, rank());
    if (ca->parsed()) return run_calibrate(cal, rank());
  } catch (const InputError& e) {
    // Every rank read the same input and failed the same way: say it once.
    if (rank() == 0) std::fprintf(stderr, "mpiformer: error: %s\n", e.what());
    return kExitInputError;
  } catch (const std::exception& e) {
    return fail(e, rank(), world());
  }
  return 0;
}
