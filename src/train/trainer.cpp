#include "train/trainer.hpp"

#include "plan/layout_search.hpp"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <utility>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/test_hooks.hpp"
#include "core/output_file.hpp"
#include "core/precision_plan.hpp"
#include "parallel/input_agreement.hpp"
#include "run_lock.hpp"
#include "parallel/mpi_session.hpp"
#include "train/backend_factory.hpp"
#include "train/checkpoint_manager.hpp"
#include "train/data_feeder.hpp"
#include "train/data_summary.hpp"
#include "train/initial_weights.hpp"
#include "model/model_flops.hpp"
#include "model/stage_options.hpp"
#include "train/progress_log.hpp"
#include "train/goodput.hpp"
#include "train/health_check.hpp"
#include "train/straggler_watch.hpp"
#include "train/run_record.hpp"
#include "train/step_executor.hpp"
#include "train/stop_policy.hpp"
#include "train/stop_request.hpp"
#include "host/gemm.hpp"
#include "train/trace_writer.hpp"
#include "train/watchdog.hpp"
#include "plan/memory_report.hpp"
#include "core/mpi_check.hpp"

namespace mpiformer {

namespace {

// What a non-finite step most likely comes from, by what the deck says: a
// fixed fp16 loss scale out of the gradients' range, a norm epsilon far
// from the usual, else the learning rate.
std::string likely_cause_of_nonfinite(const Deck& d) {
  if (d.train.precision == Precision::kFp16 && d.train.loss_scale > 0)
    return strprintf(": the likely cause is the fixed [train] loss_scale = %g (fp16's gradients "
                     "overflow at it): set loss_scale = \"dynamic\" or a smaller scale",
                     d.train.loss_scale);
  if (d.model.norm_eps < 1e-8 || d.model.norm_eps > 1e-2)
    return strprintf(": the likely cause is [model] norm_eps = %g, far from the usual 1e-5 "
                     "(from the deck or [model] init's config)",
                     d.model.norm_eps);
  return ": lower [train] lr, raise [train] grad_clip, or set [train] nonfinite = \"skip\" / "
         "[train] spike_zscore";
}

void make_dir(const std::string& dir, const char* key) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(dir, key, "cannot create the directory: " + ec.message());
}

// Writes, flushes and removes a small file in `dir`; an InputError naming
// the key otherwise.
void probe_writable(const std::string& dir, const char* key, int rank) {
  std::error_code ec;
  const std::string probe = dir + strprintf("/.write-probe-rank%d", rank);
  try {
    write_file_durably(probe, "mpiformer checks that this directory is writable\n");
  } catch (const SystemError& e) {
    throw InputError(dir, key, std::string("not writable: ") + e.what());
  }
  std::filesystem::remove(probe, ec);
}

// Seconds the watchdog allows a save or a load of this rank's state: 10x
// its time at the 100 MB/s the stop policy assumes.
void print_data_summary(const DataFeeder& data, int64_t run_samples, int64_t warn_repeats) {
  for (const std::string& line : data_summary(data, run_samples)) std::printf("%s\n", line.c_str());
  for (const std::string& w : repeat_warnings(data, run_samples, warn_repeats))
    std::fprintf(stderr, "mpiformer: warning: %s\n", w.c_str());
}

// The validation losses of one evaluation: each set's, and the blended one
// ([data] val where the deck has it, else the sources' own sets averaged by
// their weights).
struct ValLosses {
  double blended = 0;
  std::vector<std::pair<std::string, double>> per_set;
};

ValLosses evaluate_all(StepExecutor& executor, DataFeeder& data) {
  ValLosses v;
  double weighted = 0, weights = 0;
  bool has_val = false;
  for (size_t i = 0; i < data.eval_sets().size(); ++i) {
    const EvalSet& e = data.eval_sets()[i];
    data.select_eval(i);
    const double loss = executor.evaluate(data);
    if (e.source.empty()) {
      v.blended = loss;
      has_val = true;
    } else {
      v.per_set.emplace_back(e.source, loss);
      weighted += e.weight * loss;
      weights += e.weight;
    }
  }
  if (!has_val) v.blended = weighted / weights;
  return v;
}

double save_allowance(const StageBackend& stage) {
  return 12.0 * static_cast<double>(stage.param_storage()) / 1e7;
}

}  // namespace

struct Trainer::Parts {
  std::vector<std::unique_ptr<RunLock>> locks;  // rank 0 only
  std::unique_ptr<DataFeeder> data;
  BackendChoice backend;
  std::vector<Action> actions;  // this stage's schedule for one step
  SlotKinds slots;              // what its activation slots hold (slot_kinds of `actions`)
  std::unique_ptr<StageBackend> stage;
  std::unique_ptr<TraceWriter> trace;
  std::unique_ptr<Watchdog> watchdog;
  std::unique_ptr<ProcessGrid> grid;
  StageComms comms;
  std::unique_ptr<StepExecutor> executor;
  std::unique_ptr<CheckpointManager> checkpoints;
  ResumePoint start;
  double flops_per_token = 0, peak_flops = 0;
  double rank_peak = 0;  // this rank's measured peak (0: [run] peak_tflops)
  double baseline_resident = 0;  // before the trainer allocated anything
  std::string auto_choice;       // [parallel] auto: what it picked, for the log
  double restore_seconds = 0;    // reading the checkpoint resumed from
  bool multi_node = false;       // the ranks span more than one node
  HealthVerdict health;          // [run] health_check's, when it ran
  bool health_ran = false;
  // Seconds the steps' updates waited for a background save's snapshot
  // (a save's stall, not a step's work), since the goodput ledger took them.
  double snapshot_wait = 0;
};

namespace {
std::string join_hosts(const std::vector<std::string>& hosts) {
  std::string out;
  for (const std::string& h : hosts) out += (out.empty() ? "" : ", ") + h;
  return out;
}
}  // namespace

Trainer::Trainer(Deck deck, int rank, int world)
    : deck_(std::move(deck)), rank_(rank), p_(std::make_unique<Parts>()) {
  p_->baseline_resident = resident_bytes();
  const NodePlace node = node_place(MPI_COMM_WORLD);
  p_->multi_node = node.size < world;
  agree_on_input_errors(MPI_COMM_WORLD, [&] { prepare_local(world, node); });
  if (deck_.parallel.auto_layout) {
    agree_on_view(MPI_COMM_WORLD, layout_of(deck_).describe(), deck_.run.machine, "[parallel] auto");
  }
  // Every rank opened the data itself (a node-local copy, a file rewritten
  // between node launches): the same headers on every rank, or an error.
  const auto agree_on_data = [&](const TokenDataset& d, const std::string& key,
                                 const std::string& fingerprint) {
    agree_on_view(MPI_COMM_WORLD,
                  strprintf("%s, %lld tokens, vocab_size %lld, tokenizer \"%s\"%s%s",
                            d.format().c_str(), static_cast<long long>(d.num_tokens()),
                            static_cast<long long>(d.vocab_size()), d.tokenizer().c_str(),
                            fingerprint.empty() ? "" : ", fingerprint ", fingerprint.c_str()),
                  d.path(), key);
  };
  for (const TrainSource& s : p_->data->sources())
    agree_on_data(s.data, p_->data->blended() ? "[[data.source]] \"" + s.name + "\"" : "[data] train",
                  s.fingerprint);
  for (const EvalSet& e : p_->data->eval_sets())
    agree_on_data(e.data, e.source.empty() ? "[data] val" : "[[data.source]] \"" + e.source + "\" val", "");
  connect();
}

Trainer::~Trainer() = default;

void Trainer::prepare_local(int world, const NodePlace& node) {
  Parts& p = *p_;
  p.data = std::make_unique<DataFeeder>(deck_, deck_.model);
  if (deck_.parallel.auto_layout) {
    // The plan's fastest layout for the ranks this job has (every rank
    // computes the same from the same deck and machine file; the
    // constructor checks they agree).
    int fitting = 0;
    if (deck_.data.document_mask) deck_.data.attention_kept = p.data->attention_kept();
    const Prediction best = choose_layout(deck_, world, node.size, &fitting);
    deck_ = with_layout(deck_, best.layout);
    // The feeder sized its batches from the deck's micro-batch; the plan's
    // may differ (a restart on fewer ranks keeps the global batch, not the
    // micro-batch).
    p.data = std::make_unique<DataFeeder>(deck_, deck_.model);
    p.auto_choice = strprintf("auto:  %s, the fastest of %d layouts that fit on %d ranks (%s): "
                              "predicted %.0f tokens/s, %.2f GiB on the fullest rank; `mpiformer "
                              "plan` lists them",
                              best.layout.describe().c_str(), fitting, world,
                              deck_.run.machine.c_str(), best.tokens_per_s,
                              best.memory_max / (1024.0 * 1024.0 * 1024.0));
  }
  // After the data, so a data error reads the same whatever the rank count.
  const auto& par = deck_.parallel;
  if (deck_.ranks() != world) {
    const bool cp = par.cp > 1;
    throw InputError(deck_.path, cp ? "[parallel] dp x pp x tp x cp" : "[parallel] dp x pp x tp",
                     strprintf("%lld x %lld x %lld%s = %lld ranks, but the job has %d",
                               static_cast<long long>(par.dp), static_cast<long long>(par.pp),
                               static_cast<long long>(par.tp),
                               cp ? strprintf(" x %lld", static_cast<long long>(par.cp)).c_str() : "",
                               static_cast<long long>(deck_.ranks()), world));
  }
  p.backend = choose_backend(deck_, node);
  const int replicas = static_cast<int>(deck_.replicas()), cp = static_cast<int>(par.cp);
  // As ProcessGrid lays the ranks out.
  const GridPlace place = grid_place(rank_, replicas, static_cast<int>(par.tp));
  const int stage_index = place.stage, dp_rank = place.dp_rank;
  // The BLAS, oneDNN and the host loops share this rank's cores.
  host::set_compute_threads(
      host::choose_compute_threads(static_cast<int>(deck_.run.blas_threads), node.size));
  p.actions = stage_schedule(deck_, stage_index);
  p.slots = slot_kinds(p.actions);
  p.stage = make_stage_backend(deck_, p.backend, deck_.model, place, p.slots);
  p.stage->init_parameters(static_cast<uint64_t>(deck_.train.seed));
  // Every rank may write in the run directory (traces). The checkpoint
  // directory is written at the first save, possibly hours from now: find
  // out now that both can be (a read-only mount, a file in the place of a
  // directory, a full file system).
  make_dir(deck_.run.dir, "[run] dir");
  make_dir(deck_.checkpoint.dir, "[checkpoint] dir");
  // One job per run (and checkpoint) directory: rank 0 holds the locks for
  // the job's life; a second job is refused here, before it writes there.
  if (rank_ == 0) {
    p.locks.push_back(std::make_unique<RunLock>(deck_.run.dir, "[run] dir"));
    if (!std::filesystem::equivalent(deck_.run.dir, deck_.checkpoint.dir)) {
      p.locks.push_back(std::make_unique<RunLock>(deck_.checkpoint.dir, "[checkpoint] dir"));
    }
  }
  // This launch has not finished until it says so (a marker of an earlier
  // launch would tell the job scripts it had).
  if (rank_ == 0) clear_finished(deck_.run.dir);
  probe_writable(deck_.run.dir, "[run] dir", rank_);
  probe_writable(deck_.checkpoint.dir, "[checkpoint] dir", rank_);
  p.trace = std::make_unique<TraceWriter>(
      deck_.run.trace, deck_.run.dir + strprintf("/trace-rank%d.json", rank_), rank_, stage_index,
      dp_rank, place.tp_rank);
  p.data->plan(p.slots.count, static_cast<int>(par.dp), dp_rank / cp, cp, dp_rank % cp,
               par.cp_chunks);
  p.flops_per_token = training_flops_per_token(deck_.model);
}

void Trainer::connect() {
  Parts& p = *p_;
  // From here on a stuck rank ends the job. Set-up (communicators, the
  // peak measurement, the resume) is no step: it gets the automatic floor,
  // or more for a large checkpoint to read.
  p.watchdog = std::make_unique<Watchdog>(
      deck_.run.watchdog_s, deck_.run.dir, rank_,
      static_cast<int>(deck_.ranks()));
  p.watchdog->enter("setting up", 0, "every rank",
                    std::max(Watchdog::kMinAutoLimit, save_allowance(*p.stage)));
  p.grid = std::make_unique<ProcessGrid>(static_cast<int>(deck_.parallel.dp),
                                         static_cast<int>(deck_.parallel.pp),
                                         static_cast<int>(deck_.parallel.tp), MPI_COMM_WORLD,
                                         static_cast<int>(deck_.model.kv_share(deck_.parallel.tp)),
                                         static_cast<int>(deck_.parallel.ep),
                                         static_cast<int>(deck_.parallel.cp));
  ProcessGrid& g = *p.grid;
  // "auto" resolves node by node: a job whose nodes differ would run half
  // on GPUs and disagree on every message. The same verdict on every rank.
  double on_gpu[2] = {p.stage->on_device() ? 1.0 : 0.0, 1.0};
  g.world().allreduce_sum(on_gpu, 2);
  if (on_gpu[0] != 0 && on_gpu[0] != on_gpu[1]) {
    throw InputError(deck_.path, "[run] device",
                     strprintf("\"%s\" put %.0f of %.0f ranks on a GPU: every rank must run on "
                               "the same kind of device (set \"cuda\" or \"cpu\")",
                               name_of(deck_.run.device), on_gpu[0], on_gpu[1]));
  }
  p.comms = connect_stage(g, *p.stage, deck_.parallel.cp_chunks);
  p.stage->connect_data_parallel(*p.comms.dp, p.comms.expert_dp);
  p.executor = std::make_unique<StepExecutor>(deck_, g, *p.stage, p.comms, p.actions, *p.trace,
                                              *p.watchdog);
  // Every rank measures its own peak; MFU compares against their sum.
  // Its operands are the probe's, not the run's: left out of the measured
  // memory the run reports against its accounting.
  p.rank_peak = deck_.run.peak_tflops > 0
                    ? 0.0
                    : excluding_from_peak([&] { return p.stage->measure_peak_flops(); });
  // [run] health_check: every rank's GEMM rate (the probe above, or one
  // made for it where [run] peak_tflops is given) and link, against the
  // median, before the first step.
  const HealthCheck hc = deck_.run.health_check;
  if (hc == HealthCheck::kOn || (hc == HealthCheck::kAuto && p.multi_node)) {
    const double gemm = p.rank_peak > 0 ? p.rank_peak
                                        : excluding_from_peak([&] { return p.stage->measure_peak_flops(); });
    p.health = check_health(MPI_COMM_WORLD, gemm, deck_.run.health_fraction);
    p.health_ran = true;
    // For the job scripts and the next launch: the hosts named, one line
    // each ("host unix-time what"), kept across launches.
    if (rank_ == 0 && !p.health.below.empty()) {
      const std::string path = deck_.run.dir + "/unhealthy-hosts";
      const int fd = open_output(path, OutputMode::kAppend, "[run] dir");
      std::string text;
      for (size_t i = 0; i < p.health.below.size(); ++i)
        text += strprintf("%s %lld %s\n", p.health.below_host[i].c_str(),
                          static_cast<long long>(std::time(nullptr)), p.health.below[i].c_str());
      const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      ::close(fd);
      if (!ok) std::fprintf(stderr, "mpiformer: warning: cannot write %s\n", path.c_str());
    }
    if (!p.health.below.empty() && deck_.run.health_action == HealthAction::kStop) {
      std::string who;
      for (const std::string& b : p.health.below) who += (who.empty() ? "" : "; ") + b;
      throw RestartableError(strprintf(
          "the health check found rank(s) below %.2f of the median ([run] health_action = "
          "\"stop\"): %s. Hosts: %s (recorded in %s/unhealthy-hosts); nothing was trained",
          deck_.run.health_fraction, who.c_str(), join_hosts(p.health.hosts).c_str(),
          deck_.run.dir.c_str()));
    }
  }
  double peak = deck_.run.peak_tflops > 0 ? deck_.run.peak_tflops * 1e12 : p.rank_peak;
  g.world().allreduce_sum(&peak, 1);
  p.peak_flops = peak;
  p.checkpoints = std::make_unique<CheckpointManager>(deck_, deck_.model, g, *p.stage,
                                                      p.data->tokenizer());
  p.executor->before_update([&p] { p.snapshot_wait += p.checkpoints->settle_snapshot(); });
  const auto restore_begin = std::chrono::steady_clock::now();
  p.start = p.checkpoints->resume();
  p.restore_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - restore_begin).count();
  if (!deck_.model_init.empty()) {
    // Pretrained weights start a fresh run; a run that resumes has its own.
    p.watchdog->enter("reading [model] init", 0, "every rank",
                      std::max(Watchdog::kMinAutoLimit, save_allowance(*p.stage)));
    const std::string said = p.start.resumed
                                 ? "init: [model] init not read: the run resumes from its checkpoint"
                                 : load_initial_weights(deck_, *p.stage, g);
    if (rank_ == 0) std::printf("%s\n", said.c_str());
  }
  std::string reblended;
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    reblended = p.data->start_at(p.start.resumed, p.start.cursor, p.start.data_blend, p.start.path);
  });
  if (rank_ == 0 && !reblended.empty()) std::printf("%s\n", reblended.c_str());
  LossScaler& scaler = p.executor->scaler();
  if (scaler.dynamic() && p.start.has_scaler) {
    scaler.restore(p.start.scaler);
  } else if (scaler.dynamic() && p.start.resumed && rank_ == 0) {
    std::printf("fp16: the checkpoint holds no loss scaler state (written by an earlier version "
                "or another precision): the loss scale starts at %g\n", scaler.scale());
  }
}

void Trainer::print_summary() const {
  const Parts& p = *p_;
  const TrainConfig& tc = deck_.train;
  const GptConfig& cfg = deck_.model;
  const ProcessGrid& g = *p.grid;
  std::printf("mpiformer %s: resolved deck (%s)\n%s\n", MPIFORMER_VERSION, deck_.path.c_str(),
              deck_.to_toml().c_str());
  std::printf("run:   %s (%s)\n", p.start.run_id.c_str(),
              p.start.resumed ? "resumed" : "a new run");
  print_data_summary(*p.data, tc.steps * tc.global_batch, deck_.data.warn_repeats);
  const ParameterTable whole(cfg, StageRange{0, cfg.n_layer, true, true});
  std::printf("model: %lld parameters, %lld layers, %lld heads, %lld channels, vocab %lld "
              "(padded %lld)\n",
              static_cast<long long>(whole.total_numel()), static_cast<long long>(cfg.n_layer),
              static_cast<long long>(cfg.n_head), static_cast<long long>(cfg.n_embd),
              static_cast<long long>(cfg.vocab_size), static_cast<long long>(cfg.padded_vocab(g.tp())));
  if (cfg.llama()) {
    std::printf("model: llama family: %lld kv heads, SwiGLU %lld, rope_theta %g, RMSNorm eps %g, "
                "%s head\n",
                static_cast<long long>(cfg.kv_heads()), static_cast<long long>(cfg.ffn()),
                cfg.rope_theta, cfg.norm_eps, cfg.tie_embeddings ? "tied" : "untied");
    if (cfg.kv_share(g.tp()) > 1)
      std::printf("model: each kv head shared by %lld tensor ranks (tp %d > %lld kv heads), its "
                  "gradients summed over them\n",
                  static_cast<long long>(cfg.kv_share(g.tp())), g.tp(),
                  static_cast<long long>(cfg.kv_heads()));
  }
  if (cfg.moe()) {
    int64_t expert_params = 0;
    for (const auto& spec : whole.specs())
      if (spec.expert >= 0) expert_params += spec.numel();
    const int64_t active = whole.total_numel() - expert_params +
                           expert_params / cfg.experts * cfg.top_k;
    std::printf("model: mixture of experts: %lld experts in %lld of %lld layers (every %lld), top "
                "%lld, capacity %lld per expert per sequence (factor %g), aux loss %g, z loss %g; "
                "%lld parameters active per token\n",
                static_cast<long long>(cfg.experts), static_cast<long long>(cfg.moe_layers()),
                static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.moe_every),
                static_cast<long long>(cfg.top_k),
                static_cast<long long>(cfg.expert_capacity(cfg.seq_len)), cfg.capacity_factor,
                cfg.aux_loss, cfg.router_z_loss, static_cast<long long>(active));
    if (g.ep() > 1)
      std::printf("model: expert parallel over %d replicas: each holds %lld experts per sparse "
                  "layer, its gradients reduced over the %d replicas holding the same\n",
                  g.ep(), static_cast<long long>(cfg.experts / g.ep()), g.dp() / g.ep());
  }
  const ShardPlan* shards = p.stage->shard_plan();
  const std::string reduction =
      shards != nullptr
          ? strprintf("zero %d: %zu units sharded over %s%s%s, recompute %s", p.stage->zero(),
                      shards->units().size(), g.cp() > 1 ? "dp x cp" : "dp",
                      g.ep() > 1 ? strprintf(" (the experts' over the %d replicas holding them)",
                                             g.dp() / g.ep()).c_str()
                                 : "",
                      windows_vocab_grads(p.stage->zero(),
                                          deck_.train.grad_dtype == GradDtype::kBf16) &&
                              shards->vocab_pieces() > 1
                          ? strprintf(", the vocabulary%s through the windows in %lld pieces",
                                      p.stage->zero() < 3 ? "'s gradients" : "",
                                      static_cast<long long>(shards->vocab_pieces())).c_str()
                          : "",
                      name_of(deck_.train.recompute))
          : strprintf("%d gradient bucket(s)%s, recompute %s", p.stage->num_buckets(),
                      deck_.train.grad_compression != GradCompression::kNone && g.dp() > 1
                          ? strprintf(" sent as %s with error feedback",
                                      name_of(deck_.train.grad_compression)).c_str()
                          : "",
                      name_of(deck_.train.recompute));
  if (!p.auto_choice.empty()) std::printf("%s\n", p.auto_choice.c_str());
  // Interleaved, stage 0's chunks: "[0, 1) and [2, 3)".
  const StageRange& held = p.stage->range();
  std::string layers;
  for (int64_t c = 0; c < held.chunks; ++c) {
    const StageRange chunk = chunk_range(held, c);
    layers += strprintf("%s[%lld, %lld)", c == 0 ? "" : c + 1 == held.chunks ? " and " : ", ",
                        static_cast<long long>(chunk.first_layer),
                        static_cast<long long>(chunk.last_layer));
  }
  // Context parallelism: dp names the data replicas, cp the ranks each
  // one's sequences are split over (the grid's replicas are both).
  const std::string context =
      g.cp() > 1 ? strprintf(" x cp %d (%lld tokens of each sequence per rank, head-tail chunks)",
                             g.cp(), static_cast<long long>(deck_.model.seq_len / g.cp()))
                 : "";
  // Interleaved, the slots that only ever hold the model's short first
  // chunk keep its layers alone (core/slot_kinds.hpp).
  const std::string each =
      held.chunks <= 1 ? ""
      : held.first_short > 0 && p.slots.first > 0
          ? strprintf(" (one chunk each; %d of them the first chunk's %lld layer(s) alone)",
                      p.slots.first, static_cast<long long>(held.chunk_layers(0)))
          : " (one chunk each)";
  std::printf("grid:  dp %d x pp %d x tp %d%s%s, schedule %s%s, stage 0 holds layers %s; "
              "%d activation slot(s) on stage 0%s; %s\n",
              g.dp() / g.cp(), g.pp(), g.tp(), context.c_str(),
              deck_.parallel.sequence_parallel ? " (sequence parallel)" : "",
              name_of(deck_.parallel.schedule),
              held.chunks > 1 ? strprintf(" (%lld chunks per stage)",
                                          static_cast<long long>(held.chunks)).c_str()
                              : "",
              layers.c_str(), p.stage->num_slots(), each.c_str(), reduction.c_str());
  // The mapping (tp fastest, then dp, then pp), so a user can check that
  // each tensor group sits inside a node.
  std::printf("ranks: rank = (stage x %d + replica) x %d + tensor rank%s", g.dp(), g.tp(),
              g.cp() > 1 ? strprintf(", replica = data replica x %d + context rank", g.cp()).c_str()
                         : "");
  if (g.tp() > 1) {
    std::printf("; tensor groups:");
    for (int first = 0; first < g.dp() * g.pp() * g.tp(); first += g.tp())
      std::printf(" [%d-%d]", first, first + g.tp() - 1);
  }
  std::printf("\n");
  const bool gpu = p.stage->on_device();
  std::printf("device: %s on rank 0%s%s%s\n", p.stage->describe().c_str(), gpu ? "" : " (",
              gpu ? "" : p.backend.why_cpu.c_str(), gpu ? "" : ")");
  if (!p.comms.description.empty()) std::printf("comms: %s on rank 0\n", p.comms.description.c_str());
  if (tc.offload != Offload::kNone) {
    const OffloadFiles* files = p.stage->offload_files();
    const bool masters = masters_offloaded(tc.offload, precision_plan(tc.precision).weight_copy);
    std::printf("offload: AdamW's moments%s (%.1f MB on rank 0) %s; updated on the host%s%s\n",
                masters ? " and float masters" : "", p.stage->offloaded_bytes() / 1e6,
                files == nullptr
                    ? (gpu ? "in host memory"
                           : "in host memory (where the host back end keeps them anyway), "
                             "streamed in blocks as a GPU run streams them")
                    : strprintf("in %s (%s), streamed in blocks of %.1f MB per part",
                                tc.offload_dir.c_str(),
                                files->direct() ? "direct I/O"
                                                : "buffered I/O, each block dropped from the "
                                                  "page cache: the file system has no direct I/O",
                                4.0 * static_cast<double>(offload_block_elements(tc)) / 1e6)
                          .c_str(),
                !gpu ? ""
                : deck_.parallel.zero >= 2
                    ? (masters ? ", the shard's gradients in host memory too (each block's sums down "
                                 "as backward makes them), the 16-bit copy up by block"
                               : ", the shard's gradients in host memory too (each block's sums down "
                                 "as backward makes them), the masters down and up by block")
                : masters ? ", gradients down and the 16-bit copy up by block"
                          : ", gradients and masters down and up by block",
                files != nullptr && (files->replaced_stale() || files->removed_stale_ranks() > 0)
                    ? "; files an earlier run left there were replaced (those of ranks this run "
                      "does not have, removed)"
                    : "");
  }
  std::printf("%s (rank 0)\n", environment_line(launch_environment(gpu)).c_str());
  std::printf("%s", memory_table(predicted_memory(deck_, p.backend)).c_str());
  if (!gpu && tc.precision != Precision::kFp32) {
    // Said once: a CPU without bf16 units runs bf16 slower than fp32.
    bool slow = false;
    const std::string engine =
        host::narrow_gemm_engine(precision_plan(tc.precision).activations, &slow);
    if (slow && tc.precision == Precision::kBf16)
      std::fprintf(stderr, "mpiformer: warning: precision \"bf16\": %s\n", engine.c_str());
  }
  std::printf("step:  %lld sequences x %lld tokens = %lld micro-batches of %lld per replica; "
              "%d BLAS threads; peak %.1f GFLOP/s over %d rank(s) (%s)\n",
              static_cast<long long>(tc.global_batch), static_cast<long long>(cfg.seq_len),
              static_cast<long long>(deck_.grad_accum()), static_cast<long long>(tc.micro_batch),
              host::blas_threads(), p.peak_flops / 1e9, g.dp() * g.pp() * g.tp(),
              deck_.run.peak_tflops > 0 ? "[run] peak_tflops"
              : gpu ? (tc.precision == Precision::kBf16 ? "cuBLASLt bf16 GEMM 8192^3 measured now"
                                                        : "cuBLASLt fp32 GEMM 8192^3 measured now")
                    : tc.precision == Precision::kFp32
                          ? "sgemm 2048^3, best of 5, measured now and every 50 logged intervals"
                          : "16-bit GEMM 2048^3 of the run's path, best of 5, measured now and "
                            "every 50 logged intervals");
  std::fflush(stdout);
}

void Trainer::report_measured_memory(MetricsLog& metrics) const {
  const Parts& p = *p_;
  const int world = p.grid->dp() * p.grid->pp() * p.grid->tp();
  const double mine[3] = {
      static_cast<double>(p.grid->stage()),
      rank_memory(deck_, p.backend, p.grid->stage(), p.slots).total(),
      p.stage->on_device() ? p.stage->device_peak_bytes()
                           : peak_resident_bytes() - p.baseline_resident};
  std::vector<double> all(3 * static_cast<size_t>(world));
  MPI_CHECK(MPI_Allgather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, MPI_COMM_WORLD));
  std::string text = p.stage->on_device()
                         ? "memory per rank, measured (the GPU allocator's peak, MB; cuBLAS, NCCL "
                           "and the CUDA context come on top):\n"
                         : "memory per rank, measured (growth of host resident memory over the "
                           "process's baseline, MB):\n";
  std::string json = "{\"memory_measured\": [";
  for (int r = 0; r < world; ++r) {
    const double* m = &all[3 * static_cast<size_t>(r)];
    text += strprintf("  rank %d (stage %.0f): %.1f, predicted %.1f (%+.1f%%)\n", r, m[0],
                      m[2] / 1e6, m[1] / 1e6, 100.0 * (m[2] - m[1]) / m[1]);
    json += strprintf("%s{\"rank\": %d, \"stage\": %.0f, \"predicted\": %.0f, "
                      "\"peak_growth\": %.0f, \"measure\": \"%s\"}",
                      r == 0 ? "" : ", ", r, m[0], m[1], m[2],
                      p.stage->on_device() ? "gpu allocator peak" : "host resident growth");
  }
  if (rank_ == 0) {
    std::printf("%s", text.c_str());
    std::fflush(stdout);
  }
  metrics.record(json + "]}");
}

void Trainer::report_health(MetricsLog& metrics) const {
  const HealthVerdict& v = p_->health;
  metrics.record(v.json);
  if (rank_ != 0) return;
  std::printf("%s\n", v.line.c_str());
  for (const std::string& b : v.below)
    std::fprintf(stderr, "mpiformer: warning: health: %s (below [run] health_fraction %.2f; "
                 "[run] health_action = \"warn\": the run goes on)\n",
                 b.c_str(), deck_.run.health_fraction);
  for (const std::string& l : v.slow_links)
    std::fprintf(stderr, "mpiformer: warning: health: %s (below [run] health_fraction %.2f; one slow "
                 "link names neither of its ranks, and no host is recorded for it)\n",
                 l.c_str(), deck_.run.health_fraction);
  std::fflush(stdout);
}

void Trainer::end_of_launch_goodput(const GoodputLedger& goodput) const {
  if (rank_ != 0) return;
  std::printf("%s\n", goodput.line().c_str());
  const double mtbf = deck_.checkpoint.mtbf_hours * 3600;
  const GoodputTotals t = goodput.totals();
  if (mtbf > 0 && t.save_count > 0 && t.step_count > 0) {
    // Young and Daly's interval from this run's own costs: the mean
    // blocking save and the mean step.
    const double interval = young_daly_interval(goodput.mean_save(), mtbf);
    const double step = t.steps / static_cast<double>(t.step_count);
    std::printf("checkpoint interval for a mean time between failures of %g h: every %.0f steps "
                "(%s; Young/Daly: sqrt(2 x %.3g s a save x the MTBF), at %.3g s a step); "
                "[checkpoint] every = %lld now\n",
                deck_.checkpoint.mtbf_hours, std::max(1.0, std::round(interval / step)),
                clock_duration(interval).c_str(), goodput.mean_save(), step,
                static_cast<long long>(deck_.checkpoint.every));
  }
  std::fflush(stdout);
}

TrainResult Trainer::run() {
  using Clock = std::chrono::steady_clock;
  Parts& p = *p_;
  const TrainConfig& tc = deck_.train;
  const bool lead = rank_ == 0;
  if (lead) print_summary();
  ProgressLog progress(deck_, *p.grid, *p.stage, p.flops_per_token, p.rank_peak, p.peak_flops,
                       p.start.resumed);
  // The first line each launch writes: what tuned its transports.
  progress.metrics().record(environment_json(launch_environment(p.stage->on_device())));
  progress.metrics().record(memory_json(predicted_memory(deck_, p.backend)));
  if (p.health_ran) report_health(progress.metrics());
  StopPolicy stop(deck_.run.time_limit, 12 * p.stage->param_storage());
  const int64_t end_step = tc.stop_at > 0 ? std::min(tc.stop_at, tc.steps) : tc.steps;
  if (lead && p.start.step >= end_step) {
    std::printf("nothing to do: the checkpoint is at step %lld, this run ends at step %lld\n",
                static_cast<long long>(p.start.step), static_cast<long long>(end_step));
  }
  // Only rank 0 keeps the time ledger: every rank's steps and saves end
  // together (their collectives), so its figures are the run's.
  GoodputLedger goodput(deck_.run.dir, lead, p.start.resumed, p.start.step);
  if (!goodput.warning().empty())
    std::fprintf(stderr, "mpiformer: warning: %s\n", goodput.warning().c_str());
  goodput.restored(p.restore_seconds);
  goodput.steps_begin();
  // A launch's figures reach the ledger and metrics.jsonl with each save
  // and at its end; the ledger alone also with each logged step, so a
  // launch that dies leaves its time since its last save on record.
  const auto report_goodput = [&] {
    goodput.write();
    progress.metrics().record(goodput.json());
  };
  // [checkpoint] async: the save in flight (its step, and the productive
  // step time when its snapshot was taken); finish_background publishes it
  // once every rank's write is done (wait: waits for them). Collective.
  int64_t background_step = 0;
  double background_productive = 0;
  const auto finish_background = [&](bool wait, int64_t at) {
    if (!p.checkpoints->background_pending()) return 0.0;
    if (wait) {
      p.watchdog->enter("waiting for the background checkpoint write", at, "every rank",
                        save_allowance(*p.stage));
    }
    const double s = p.checkpoints->finish_background(wait);
    if (p.checkpoints->background_pending()) return s;
    goodput.save_waited(s);
    goodput.checkpoint_kept(background_step, background_productive);
    progress.metrics().record(
        strprintf("{\"checkpoint_saved\": %lld}", static_cast<long long>(background_step)));
    report_goodput();
    return s;
  };
  TrainResult result;
  result.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  StragglerWatch stragglers(MPI_COMM_WORLD, deck_.run.straggler_every, deck_.run.health_fraction,
                            !p.stage->on_device() && !test_hooks::rehearse_gpu(), p.grid->stage());
  for (int64_t step = p.start.step; step < end_step; ++step) {
    const auto t0 = Clock::now();
    const StepTimes waits_before = progress.times();
    const StepResult r = p.executor->train_step(step, *p.data, stop.out_of_time(t0), progress.times());
    const double step_s = std::chrono::duration<double>(Clock::now() - t0).count();
    // An update's wait for a background save's snapshot is the save's.
    const double snapshot_wait = std::exchange(p.snapshot_wait, 0.0);
    stragglers.step_done(step_s, waits_before, progress.times());
    stop.step_took(step_s);
    p.watchdog->step_took(step_s);
    result.losses.push_back(r.loss);
    const int64_t done = step + 1;
    goodput.step_done(done, step_s - snapshot_wait);
    goodput.save_waited(snapshot_wait);
    if (done % tc.log_every == 0) goodput.write(false);
    progress.step_done(done, end_step, step_s, r, p.data->cursor());
    if (lead)
      for (const std::string& note : r.data_notes)
        std::printf("step %lld: %s\n", static_cast<long long>(done), note.c_str());
    if (!r.note.empty() && p.grid->world_rank() == 0)
      std::fprintf(stderr, "mpiformer: warning: step %lld: %s\n", static_cast<long long>(done),
                   r.note.c_str());
    if (r.verdict == StepVerdict::kStop) {
      // Every rank judged the same values: all stop here, before anything
      // of this step is applied or saved.
      const bool scale = r.stop_key != "[train] nonfinite";
      throw AgreedInputError(
          deck_.path, r.stop_key,
          strprintf("step %lld: %s; the run stops with nothing of this step applied or saved "
                    "(the last checkpoint is the good one)%s",
                    static_cast<long long>(done), r.why.c_str(),
                    scale ? "" : likely_cause_of_nonfinite(deck_).c_str()));
    }
    const bool eval_due = tc.eval_every > 0 && done % tc.eval_every == 0;
    if (!p.data->eval_sets().empty() && (eval_due || done == tc.steps)) {
      const auto te = Clock::now();
      const ValLosses v = evaluate_all(*p.executor, *p.data);
      result.final_val_loss = v.blended;
      stop.eval_took(std::chrono::duration<double>(Clock::now() - te).count());
      goodput.eval_done(std::chrono::duration<double>(Clock::now() - te).count());
      progress.exclude_pause();
      progress.eval_done(done, v.blended, v.per_set);
    }
    // Every rank reaches the end of a window together (collective).
    const StragglerWatch::Finding slow = stragglers.window_end(done);
    for (const std::string& rec : slow.records) progress.metrics().record(rec);
    if (lead)
      for (const std::string& line : slow.lines) std::fprintf(stderr, "mpiformer: warning: %s\n", line.c_str());
    // A background write done on every rank is published between steps.
    finish_background(false, done);
    const int64_t every = deck_.checkpoint.every;
    const bool at_end = done == end_step && (deck_.checkpoint.at_end || done < tc.steps);
    if ((every > 0 && done % every == 0) || at_end || r.stop) {
      // On the way, in the background where the deck asks; the last save
      // and one before a stop are synchronous, read back inline (the run
      // ends with it).
      const bool on_the_way = !at_end && !r.stop;
      const bool background = deck_.checkpoint.async && on_the_way;
      const bool read_back_behind =
          !background && on_the_way && deck_.checkpoint.read_back == ReadBack::kBackground;
      using Mode = CheckpointManager::Mode;
      if (p.checkpoints->background_pending()) {
        const int64_t was = background_step;
        const double waited = finish_background(true, done);
        if (lead) {
          std::printf("checkpoint: training waited %.2f s for the background write of step %lld "
                      "to finish%s\n",
                      waited, static_cast<long long>(was),
                      r.stop ? " before the stop's synchronous save" : "");
          std::fflush(stdout);
        }
      }
      p.watchdog->enter("checkpoint save", done, "every rank (collective write)",
                        save_allowance(*p.stage));
      const double save_s = p.checkpoints->save(
          done, DataPosition{p.data->cursor(), p.data->epoch(), p.data->record()}, p.executor->scaler(),
          background ? Mode::kBackground : read_back_behind ? Mode::kReadBackBehind : Mode::kInline);
      if (background || p.checkpoints->background_pending()) {
        // Published later (finish_background): what training waited now.
        // A stop's save reads back inline: the policy plans for the whole.
        if (!background) stop.save_took(save_s + p.checkpoints->last_read_back_seconds());
        goodput.save_waited(save_s);
        background_step = done;
        background_productive = goodput.productive();
      } else {
        stop.save_took(save_s);
        goodput.save_done(done, save_s);
        // The job scripts count the steps a failure loses from this.
        progress.metrics().record(strprintf("{\"checkpoint_saved\": %lld}", static_cast<long long>(done)));
        report_goodput();
      }
    }
    if (r.stop && done < end_step) {
      result.stopped_to_requeue = true;
      if (lead) {
        std::printf("stopping after step %lld to be requeued (%s); exit code %d\n",
                    static_cast<long long>(done), stop.reason(), kExitRequeue);
        std::fflush(stdout);
      }
      report_measured_memory(progress.metrics());
      end_of_launch_goodput(goodput);
      report_goodput();
      return result;
    }
  }
  finish_background(true, end_step);  // a run without a last save ([checkpoint] at_end = false)
  p.watchdog->enter("comparing the tied embedding's copies", end_step, "the first and last stage");
  p.checkpoints->check_tied_embedding();
  p.watchdog->enter("comparing the tensor groups' replicated tensors", end_step,
                    "the ranks of this tensor group");
  p.checkpoints->check_tensor_replicas();
  report_measured_memory(progress.metrics());
  if (lead && !p.data->eval_sets().empty() && end_step == tc.steps && p.start.step < end_step) {
    std::printf("final val loss %.4f after %lld steps\n", result.final_val_loss,
                static_cast<long long>(tc.steps));
  }
  end_of_launch_goodput(goodput);
  report_goodput();
  // Last: every rank has passed the collective checks above.
  if (lead) mark_finished(deck_.run.dir, end_step, tc.steps, p.start.run_id);
  return result;
}

}  // namespace mpiformer
