// mpiformer plan DECK --ranks N: every layout the model allows on N ranks,
// those that fit, fastest first (plan/layout_search.hpp); and mpiformer
// calibrate: the machine file it prices them with.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include "commands.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/layer_chunks.hpp"
#include "core/output_path.hpp"
#include "deck.hpp"
#include "parallel/mpi_session.hpp"
#include "token_dataset.hpp"
#include "train/calibrate_offload.hpp"
#include "train/calibration.hpp"
#ifdef MPIFORMER_HAVE_CUDA
#include "cuda/device.hpp"
#endif
#include "plan/layout_search.hpp"
#include "plan/plan_explain.hpp"
#include "train/data_summary.hpp"

namespace mpiformer {

Deck load_planning_deck(const std::string& path, const std::vector<std::string>& overrides) {
  Deck deck = load_deck(path, overrides);
  resolve_model_init(deck);
  if (deck.model.vocab_size == 0) {
    // As the run does: the vocabulary comes from the data.
    try {
      const std::string& first = deck.data.sources.empty() ? deck.data.train : deck.data.sources[0].path;
      deck.model.vocab_size =
          TokenDataset(first, DataLabel{deck.data.vocab_size, deck.data.tokenizer}).vocab_size();
    } catch (const InputError& e) {
      throw InputError(path, "[model] vocab_size",
                       "not given, and the training data cannot say (" + std::string(e.what()) +
                           "); give [model] vocab_size to plan without the data");
    }
  }
  if (deck.data.document_mask) {
    // What the mask leaves of a GPU's attention, from the data (a plan
    // needs none: without it, all of it).
    try {
      GptConfig cfg = deck.model;
      deck.data.attention_kept = DataFeeder(deck, cfg).attention_kept();
    } catch (const InputError&) {
    }
  }
  return deck;
}

namespace {

const double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string prediction_json(const Prediction& p) {
  const Layout& l = p.layout;
  std::string j = strprintf(
      "{\"dp\": %lld, \"pp\": %lld, \"tp\": %lld, \"micro_batch\": %lld, \"zero\": %lld, "
      "\"recompute\": \"%s\", \"schedule\": \"%s\", \"virtual_stages\": %lld, "
      "\"sequence_parallel\": %s, \"ep\": %lld, \"cp\": %lld, \"expert_imbalance\": %.6g, "
      "\"offload\": \"%s\", \"step_s\": %.6g, "
      "\"compute_s\": %.6g, \"tp_comm_s\": %.6g, \"ep_comm_s\": %.6g, \"cp_comm_s\": %.6g, "
      "\"exposed_comm_s\": %.6g, "
      "\"bubble_s\": %.6g, \"optimizer_s\": %.6g, "
      "\"tokens_per_s\": %.6g, \"mfu\": %.4g, \"memory_max\": %.0f, \"runtime\": %.0f, "
      "\"memory_available\": %.0f, \"memory_planned\": %.0f, "
      "\"fits\": %s, \"memory\": [",  // per stage, without the machine's runtime bytes
      static_cast<long long>(l.dp), static_cast<long long>(l.pp), static_cast<long long>(l.tp),
      static_cast<long long>(l.micro_batch), static_cast<long long>(l.zero), name_of(l.recompute),
      name_of(l.schedule), static_cast<long long>(l.virtual_stages),
      l.sequence_parallel ? "true" : "false", static_cast<long long>(l.ep),
      static_cast<long long>(l.cp), p.expert_imbalance, name_of(l.offload),
      p.step.step_time, p.compute, p.tp_comm, p.ep_comm, p.cp_comm, p.exposed_comm, p.bubble,
      p.optimizer,
      p.tokens_per_s, p.mfu, p.memory_max, p.runtime, p.memory_available, p.memory_planned,
      p.fits ? "true" : "false");
  for (size_t s = 0; s < p.memory.size(); ++s)
    j += strprintf("%s%.0f", s ? ", " : "", p.memory[s].total());
  return j + "]}";
}

// The fullest stage's memory by category, GiB.
std::string memory_split(const Prediction& p) {
  const RankMemory* m = &p.memory[0];
  for (const RankMemory& r : p.memory)
    if (r.total() > m->total()) m = &r;
  return strprintf("%.2f = %.2f + %.2f + %.2f + %.2f + %.2f", p.memory_max / kGiB,
                   m->parameters() / kGiB, m->gradients() / kGiB, m->optimizer / kGiB,
                   m->stage.activations / kGiB,
                   (m->stage.scratch + m->comm + m->workspace + m->offload_buffers +
                    (p.memory_max - m->total())) / kGiB);
}

std::string prediction_row(int i, const Prediction& p) {
  const double ms = 1e3;
  return strprintf(
      "%3d | %-50s | %10.1f | %5.1f%% | %9.2f = %8.2f + %7.2f + %7.2f + %6.2f | %7.2f | %7.2f | "
      "%7.2f | %s\n",
      i, p.layout.describe().c_str(), p.tokens_per_s, 100 * p.mfu, ms * p.step.step_time,
      ms * p.compute, ms * p.exposed_comm, ms * p.bubble, ms * p.optimizer, ms * p.tp_comm,
      ms * p.ep_comm, ms * p.cp_comm, memory_split(p).c_str());
}

// The run's data as the run will show it, with its repeat warnings; a plan
// needs no data, so data that cannot be read is said, not fatal.
std::vector<std::string> data_lines(const Deck& deck) {
  const int64_t samples = deck.train.steps * deck.train.global_batch;
  try {
    GptConfig cfg = deck.model;
    const DataFeeder data(deck, cfg);
    std::vector<std::string> lines = data_summary(data, samples);
    for (const std::string& w : repeat_warnings(data, samples, deck.data.warn_repeats))
      lines.push_back("warning: " + w);
    if (deck.data.document_mask)
      lines.push_back(strprintf("documents: the mask keeps %.1f%% of causal attention's key-query "
                                "pairs in the first windows (a GPU's attention priced at that share)",
                                100 * deck.data.attention_kept));
    return lines;
  } catch (const InputError& e) {
    return {std::string("data:  not read (") + e.what() + ")"};
  }
}

void print_plan(const PlanArgs& args, const Deck& deck, const MachineSpec& machine, const Plan& plan,
                const std::vector<Prediction>& shown) {
  if (args.json) {
    std::string j = strprintf("{\"ranks\": %d, \"considered\": %d, \"machine\": \"%s\", \"layouts\": [",
                              plan.ranks, plan.considered, machine.name.c_str());
    for (size_t i = 0; i < shown.size() && static_cast<int>(i) < args.top; ++i)
      j += (i ? ",\n  " : "\n  ") + prediction_json(shown[i]);
    std::printf("%s]}\n", j.c_str());
  } else {
    const GptConfig& c = deck.model;
    std::printf("plan: %s (%lld layers, %lld heads, %lld channels, seq %lld, vocab %lld; global "
                "batch %lld) on %d ranks of %s (%s)\n",
                args.deck.c_str(), static_cast<long long>(c.n_layer), static_cast<long long>(c.n_head),
                static_cast<long long>(c.n_embd), static_cast<long long>(c.seq_len),
                static_cast<long long>(c.vocab_size), static_cast<long long>(deck.train.global_batch),
                plan.ranks, machine.name.c_str(), args.machine.c_str());
    for (const std::string& line : data_lines(deck)) std::printf("%s\n", line.c_str());
    std::printf("%d layouts considered, %d fit in %.2f GiB per rank (%.2f GiB less [parallel] "
                "memory_margin %g); step time = compute (of which the tensor collectives, the "
                "experts' all-to-alls and the context ring's sends not hidden by attention) + "
                "exposed communication + bubble + optimizer\n",
                plan.considered, plan.fit, plan.leanest.memory_planned / kGiB,
                plan.leanest.memory_available / kGiB, deck.parallel.memory_margin);
    std::printf("  # | layout                                             |   tokens/s |   MFU |   step "
                "ms = compute + exposed +  bubble +  optim | tp comm | ep comm | cp comm | GiB per rank = "
                "params + grads + AdamW + activations + other\n");
    for (size_t i = 0; i < shown.size() && static_cast<int>(i) < args.top; ++i)
      std::printf("%s", prediction_row(static_cast<int>(i) + 1, shown[i]).c_str());
    if (!shown.empty() && shown.front().layout.virtual_stages > 1) {
      // Where interleaving's chunks are not all alike, say so: the stages
      // at the ends then hold fewer layers than the others.
      const Layout& l = shown.front().layout;
      const LayerChunks cut = layer_chunks(c.n_layer, l.pp, l.virtual_stages);
      if (cut.first_short + cut.last_short > 0)
        std::printf("chunks of #1: %lld layers into %lld x %lld chunks of %lld, the model's first "
                    "(the embedding's) %lld and its last (the head's) %lld\n",
                    static_cast<long long>(c.n_layer), static_cast<long long>(l.pp),
                    static_cast<long long>(l.virtual_stages), static_cast<long long>(cut.full),
                    static_cast<long long>(cut.full - cut.first_short),
                    static_cast<long long>(cut.full - cut.last_short));
    }
    if (args.as_given && !shown.empty()) {
      std::string k = "compute of the busiest stage by kernel (ms per step):";
      for (const auto& [name, t] : shown.front().kernels) k += strprintf(" %s %.2f,", name.c_str(), 1e3 * t);
      k.back() = '\n';
      std::printf("%s", k.c_str());
    }
    if (!args.explain.empty() && !shown.empty()) {
      std::printf("timeline of #1 (predicted, Chrome trace): %s\n", args.explain.c_str());
      for (const std::string& line : explain_lines(with_layout(deck, shown.front().layout), machine,
                                                   shown.front()))
        std::printf("%s\n", line.c_str());
    }
  }
}

}  // namespace

int run_plan(const PlanArgs& args, int rank) {
  // Every rank of a launch computes the same answer (and so fails alike,
  // exit 2 everywhere); rank 0 prints it.
  if (!args.explain.empty()) {
    refuse_input_as_output(args.explain, "--explain",
                           {{"the deck", args.deck}, {"the machine file", args.machine}});
    require_writable_folder(args.explain, "--explain");
  }
  std::vector<std::string> overrides = args.overrides;
  if (!args.memory_margin.empty()) overrides.push_back("parallel.memory_margin=" + args.memory_margin);
  const Deck deck = load_planning_deck(args.deck, overrides);
  const MachineSpec machine = load_machine(args.machine);
  Plan plan;
  if (args.as_given) {
    plan.ranks = static_cast<int>(deck.ranks());
    if (args.ranks > 0 && args.ranks != plan.ranks) {
      throw InputError(args.deck,
                       deck.parallel.cp > 1 ? "[parallel] dp x pp x tp x cp" : "[parallel] dp x pp x tp",
                       strprintf("%d ranks, but --ranks %d", plan.ranks, args.ranks));
    }
    Prediction p = predict_step(deck, machine, args.ranks_per_node);
    plan.considered = 1;
    plan.leanest = p;
    plan.fit = p.fits;
    if (p.fits) plan.fitting.push_back(p);
  } else {
    if (args.ranks <= 0) throw InputError("--ranks", "", "give the ranks to plan for (--ranks N)");
    // This node's cores, shared with the launch's other ranks on it (each
    // computes the same plan); rank 0 says how the search goes when it
    // takes more than a few seconds.
    PlanOptions options;
    options.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                      node_place().size);
    options.keep = std::max(1, args.top);  // what is shown
    if (rank == 0) {
      options.progress = [](int done, int total, double seconds, const Prediction* best) {
        std::fprintf(stderr, "plan: %d of %d layouts priced in %.0f s (about %.0f s left)%s%s\n",
                     done, total, seconds, seconds * (total - done) / std::max(1, done),
                     best != nullptr ? "; the fastest that fits so far: " : "; none fits so far",
                     best != nullptr ? strprintf("%s, %.1f tokens/s", best->layout.describe().c_str(),
                                                 best->tokens_per_s).c_str()
                                     : "");
      };
    }
    plan = plan_layouts(deck, machine, args.ranks, args.ranks_per_node, options);
  }
  const std::vector<Prediction>& shown = plan.fitting.empty() && args.as_given
                                             ? std::vector<Prediction>{plan.leanest}
                                             : plan.fitting;
  if (rank == 0 && !args.explain.empty() && !shown.empty()) {
    // The search keeps no timelines: the first layout priced again.
    const SimulatedStep step =
        args.as_given ? shown.front().step
                      : predict_step(with_layout(deck, shown.front().layout), machine, args.ranks_per_node).step;
    write_file_durably(args.explain, timeline_trace(step));
  }
  if (rank == 0) print_plan(args, deck, machine, plan, shown);
  std::fflush(stdout);
  if (plan.fitting.empty() && args.as_given) {
    throw InputError(args.deck, "",
                     strprintf("this layout (%s) needs %.1f GiB per rank; %s gives %.2f GiB per rank, %s",
                               plan.leanest.layout.describe().c_str(), plan.leanest.memory_max / kGiB,
                               machine.name.c_str(), plan.leanest.memory_available / kGiB,
                               margin_note(deck, plan.leanest).c_str()));
  }
  if (plan.fitting.empty()) throw InputError(args.deck, "", plan_refusal(deck, machine, plan));
  return 0;
}

int run_calibrate(const CalibrateArgs& args, int rank) {
  CalibrationRequest req;
  req.name = args.name;
  req.max_tp = args.max_tp;
  req.seconds = args.seconds;
  req.probe_tokens = args.probe_tokens;
  req.scratch = args.output + ".save-probe.h5";
  // Before minutes of measuring, not after.
  require_writable_folder(args.output, "calibrate --output");
  for (const std::string& d : args.decks) {
    refuse_input_as_output(args.output, "calibrate --output", {{"a deck it reads", d}});
    const Deck deck = load_planning_deck(d, {});
    req.models.push_back(deck.model);
    req.batches.push_back(deck.train.global_batch);
    req.micro_batches.push_back(deck.train.micro_batch);
    req.decks.push_back(deck);
  }
  if (req.models.empty()) {
    // The shipped decks' shapes: a byte-level tiny model and GPT-2 small.
    req.models = {GptConfig{4, 4, 128, 64, 256}, GptConfig{12, 12, 768, 1024, 50257}};
    req.batches = {32, 16};
    req.micro_batches = {16, 1};
  }
  Device device = Device::kCpu;
  parse_setting(kDeviceNames, args.device, &device);
  if (device == Device::kAuto) {
#ifdef MPIFORMER_HAVE_CUDA
    device = cuda::device_count() > 0 ? Device::kCuda : Device::kCpu;
#else
    device = Device::kCpu;
#endif
  }
  req.device = device;
  req.precision = device == Device::kCuda ? Precision::kBf16 : Precision::kFp32;
  if (!args.precision.empty()) parse_setting(kPrecisionNames, args.precision, &req.precision);
  MachineSpec m = calibrate_machine(req);
  // A GPU run's offloaded update runs on the host: priced with its rate.
  if (device == Device::kCuda || !args.offload_dir.empty()) calibration::measure_host_adamw(m);
  if (!args.offload_dir.empty())
    calibration::measure_offload_disk(args.offload_dir, args.offload_mb * 1e6, m);
  if (rank == 0) {
    const std::string what = device == Device::kCuda
                                 ? std::string("GPUs, ") + name_of(req.precision) +
                                       " rates: plan decks of that precision"
                                 : std::string("host back end, ") + name_of(req.precision) +
                                       " rates: plan decks of that precision";
    const std::string text = "# Measured by mpiformer calibrate " + std::string(MPIFORMER_VERSION) +
                             " (" + what + ", " + std::to_string(m.devices_per_node) +
                             " devices per node)\n" + m.to_toml();
    write_file_durably(args.output, text);
    std::printf("calibrate: wrote %s (%zu matmul shapes, %zu attention, %zu kernel sizes; peak "
                "%.1f GFLOP/s per rank; intra-node all-reduce %.1f us + %.2f GB/s)\n",
                args.output.c_str(), m.matmul.size(), m.attention.size(), m.kernels.size(),
                m.peak_flops / 1e9, m.intra.allreduce.latency * 1e6, m.intra.allreduce.bandwidth / 1e9);
    if (m.host_adamw_bandwidth > 0) {
      std::printf("calibrate: [offload] the host's AdamW %.1f GB/s (the node's)", m.host_adamw_bandwidth / 1e9);
      if (m.host_link_bandwidth > 0)
        std::printf("; each GPU's link to page-locked memory %.1f GB/s", m.host_link_bandwidth / 1e9);
      if (!args.offload_dir.empty())
        std::printf("; the disk under %s, every rank of a node at once: read %.2f GB/s, write "
                    "%.2f GB/s (the node's)",
                    args.offload_dir.c_str(), m.disk_read_bandwidth / 1e9, m.disk_write_bandwidth / 1e9);
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace mpiformer
