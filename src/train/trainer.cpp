#include "train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>

#include "core/error.hpp"
#include "core/format.hpp"
#include "host/adamw.hpp"
#include "host/gemm.hpp"
#include "model/gpt_stage.hpp"
#include "parallel/input_agreement.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/process_grid.hpp"
#include "token_dataset.hpp"
#include "checkpoint.hpp"
#include "checkpoint_store.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/checkpointing.hpp"
#include "train/grad_reducer.hpp"
#include "train/lr_schedule.hpp"
#include "train/metrics_log.hpp"
#include "train/model_flops.hpp"
#include "train/sample_order.hpp"
#include "train/stop_request.hpp"
#include "train/trace_writer.hpp"

namespace mpiformer {

using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void check_dataset(const TokenDataset& d, const GptConfig& cfg, const std::string& key) {
  if (d.vocab_size() > cfg.vocab_size) {
    throw InputError(d.path(), "vocab_size",
                     strprintf("the data's vocabulary (%lld) exceeds [model] vocab_size (%lld)",
                               static_cast<long long>(d.vocab_size()),
                               static_cast<long long>(cfg.vocab_size)));
  }
  if (d.num_windows(cfg.seq_len) < 1) {
    throw InputError(d.path(), key,
                     strprintf("%lld tokens: too few for one sample of [model] seq_len + 1 = %lld",
                               static_cast<long long>(d.num_tokens()),
                               static_cast<long long>(cfg.seq_len + 1)));
  }
}

// Message tags: activations and gradients of micro-batch m never share one.
int activation_tag(int micro) { return 2 * micro; }
int gradient_tag(int micro) { return 2 * micro + 1; }

}  // namespace

struct Trainer::State {
  TokenDataset train;
  std::unique_ptr<TokenDataset> val;
  GptConfig cfg;
  std::unique_ptr<ProcessGrid> grid;
  std::vector<Action> actions;  // this stage's schedule for one step
  std::unique_ptr<GptStage<float>> stage;
  std::unique_ptr<AdamWOptimizer<float>> opt;
  std::unique_ptr<SampleOrder> order;
  std::unique_ptr<GradReducer> reducer;
  std::unique_ptr<TraceWriter> trace;
  std::vector<int64_t> eval_windows;
  // The activation pool: one entry per slot the schedule keeps live.
  std::vector<std::vector<int32_t>> inputs, targets;
  std::vector<std::vector<float>> grad_out;
  std::vector<Pending> act_sends, grad_sends;
  std::vector<float> grad_in;
  std::vector<int32_t> window;
  double flops_per_token = 0, peak_flops = 0;
  int64_t start_step = 0;  // steps already done (from a checkpoint)
  int64_t cursor = 0;      // global sample position of the next step
  bool resumed = false;
  explicit State(const std::string& train_path) : train(train_path) {}
};

struct Trainer::StepTimes {
  double recv_wait = 0;       // blocked receiving activations or gradients
  double reduce_exposed = 0;  // data-parallel reduction not hidden by backward
};

Trainer::Trainer(Deck deck, int rank, int world) : deck_(std::move(deck)), rank_(rank) {
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    open_inputs(world);
    prepare_local();
  });
  connect();
}

void Trainer::open_inputs(int world) {
  st_ = std::make_unique<State>(deck_.data.train);
  if (deck_.model.vocab_size == 0) deck_.model.vocab_size = st_->train.vocab_size();
  st_->cfg = deck_.model;
  check_dataset(st_->train, st_->cfg, "[data] train");
  if (!deck_.data.val.empty()) {
    st_->val = std::make_unique<TokenDataset>(deck_.data.val);
    check_dataset(*st_->val, st_->cfg, "[data] val");
    if (st_->val->tokenizer() != st_->train.tokenizer()) {
      throw InputError(st_->val->path(), "tokenizer",
                       "'" + st_->val->tokenizer() + "' differs from the training data's '" +
                           st_->train.tokenizer() + "'");
    }
  }
  // After the data, so a data error reads the same whatever the rank count.
  const auto& par = deck_.parallel;
  if (par.dp * par.pp != world) {
    throw InputError(deck_.path, "[parallel] dp x pp",
                     strprintf("%lld x %lld = %lld ranks, but the job has %d",
                               static_cast<long long>(par.dp), static_cast<long long>(par.pp),
                               static_cast<long long>(par.dp * par.pp), world));
  }
}

Trainer::~Trainer() = default;

void Trainer::prepare_local() {
  State& s = *st_;
  const TrainConfig& tc = deck_.train;
  const int64_t B = tc.micro_batch, T = s.cfg.seq_len, M = deck_.grad_accum();
  const int dp = static_cast<int>(deck_.parallel.dp), pp = static_cast<int>(deck_.parallel.pp);
  const int stage_index = rank_ / dp, dp_rank = rank_ % dp;  // as ProcessGrid lays them out
  if (deck_.run.blas_threads > 0) host::set_blas_threads(static_cast<int>(deck_.run.blas_threads));
  s.actions = pipeline_schedule(parse_schedule(deck_.parallel.schedule), pp, stage_index,
                                static_cast<int>(M));
  const int slots = max_live_activations(s.actions);
  s.stage = std::make_unique<GptStage<float>>(s.cfg, partition_stage(s.cfg, stage_index, pp), B,
                                              slots);
  s.stage->init_parameters(static_cast<uint64_t>(tc.seed));
  s.opt = std::make_unique<AdamWOptimizer<float>>(
      s.stage->table(), AdamWSettings{tc.beta1, tc.beta2, tc.eps, tc.weight_decay});
  s.order = std::make_unique<SampleOrder>(s.train.num_windows(T), static_cast<uint64_t>(tc.seed));
  // Every rank may write here (traces), so every rank makes sure it exists.
  std::error_code ec;
  std::filesystem::create_directories(deck_.run.dir, ec);
  if (ec) {
    throw InputError(deck_.run.dir, "[run] dir", "cannot create the run directory: " + ec.message());
  }
  s.trace = std::make_unique<TraceWriter>(
      deck_.run.trace, deck_.run.dir + strprintf("/trace-rank%d.json", rank_), rank_, stage_index,
      dp_rank);
  const bool first = stage_index == 0, last = stage_index == pp - 1;
  s.inputs.assign(slots, std::vector<int32_t>(B * T));
  s.targets.assign(slots, std::vector<int32_t>(B * T));
  s.grad_out.assign(first ? 0 : slots, std::vector<float>(B * T * s.cfg.n_embd));
  s.act_sends.resize(slots);
  s.grad_sends.resize(slots);
  if (!last) s.grad_in.resize(B * T * s.cfg.n_embd);
  s.window.resize(T + 1);
  s.flops_per_token = training_flops_per_token(s.cfg);

  // A fixed evaluation set: eval_batches global batches of windows spread
  // evenly over the validation data, in whole micro-batches on every replica.
  if (s.val) {
    const int64_t have = s.val->num_windows(T), unit = B * dp;
    int64_t want = std::min(tc.eval_batches * tc.global_batch, have);
    want -= want % unit;
    if (want == 0) {
      throw InputError(s.val->path(), "[data] val",
                       strprintf("%lld windows of %lld tokens: fewer than one micro-batch on "
                                 "each replica (%lld)",
                                 static_cast<long long>(have), static_cast<long long>(T + 1),
                                 static_cast<long long>(unit)));
    }
    for (int64_t k = 0; k < want; ++k) s.eval_windows.push_back(k * have / want);
  }
}

void Trainer::connect() {
  State& s = *st_;
  s.grid = std::make_unique<ProcessGrid>(static_cast<int>(deck_.parallel.dp),
                                         static_cast<int>(deck_.parallel.pp));
  s.reducer = std::make_unique<GradReducer>(s.stage->table(), deck_.parallel.bucket_mb * (1 << 20),
                                            s.grid->data_parallel());
  // Every rank measures its own peak; MFU compares against their sum.
  double peak = deck_.run.peak_tflops > 0 ? deck_.run.peak_tflops * 1e12 : measure_sgemm_peak();
  s.grid->world().allreduce_sum(&peak, 1);
  s.peak_flops = peak;
  resume();
}

void Trainer::resume() {
  State& s = *st_;
  const CheckpointConfig& cc = deck_.checkpoint;
  if (cc.resume == "never") return;
  const bool automatic = cc.resume == "auto";
  // Rank 0 decides what to try (file systems may disagree between nodes):
  // `latest` first, then every complete checkpoint, newest first.
  std::string list;
  if (rank_ == 0) {
    if (!automatic) {
      list = cc.resume;
    } else {
      const CheckpointStore store(cc.dir);
      std::vector<std::string> names;
      if (const std::string l = store.latest(); !l.empty()) names.push_back(l);
      for (const auto& p : store.complete())
        if (std::find(names.begin(), names.end(), p) == names.end()) names.push_back(p);
      for (const auto& n : names) list += n + "\n";
    }
  }
  int len = static_cast<int>(list.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  list.resize(static_cast<size_t>(len));
  MPI_Bcast(list.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> candidates;
  for (size_t a = 0, b; a < list.size(); a = b + 1) {
    b = list.find('\n', a);
    if (b == std::string::npos) b = list.size();
    if (b > a) candidates.push_back(list.substr(a, b - a));
  }

  GptStage<float>& stage = *s.stage;
  const int64_t n = stage.param_storage();
  std::string last_error;
  for (const auto& path : candidates) {
    std::vector<float> params(n), m(n), v(n);
    CheckpointMeta meta;
    try {
      // Never half-loaded: every rank reads into scratch, all agree, then commit.
      agree_on_input_errors(MPI_COMM_WORLD, [&] {
        CheckpointReader reader(path);
        restore_stage(reader, s.cfg, stage.table(), StageState{params.data(), m.data(), v.data()});
        meta = reader.meta();
      });
    } catch (const InputError& e) {
      if (!automatic) throw;
      last_error = e.what();
      if (rank_ == 0) {
        std::fprintf(stderr, "mpiformer: warning: cannot resume from %s: %s; trying an older one\n",
                     path.c_str(), e.what());
      }
      continue;
    }
    std::copy(params.begin(), params.end(), stage.params());
    std::copy(m.begin(), m.end(), s.opt->m().begin());
    std::copy(v.begin(), v.end(), s.opt->v().begin());
    s.start_step = meta.step;
    s.cursor = meta.sample_position;
    s.resumed = true;
    if (rank_ == 0) {
      std::printf("resumed from %s: step %lld, %lld samples seen (epoch %lld), written by "
                  "dp %lld x pp %lld on %lld rank(s); now dp %lld x pp %lld\n",
                  path.c_str(), static_cast<long long>(meta.step),
                  static_cast<long long>(meta.sample_position), static_cast<long long>(meta.epoch),
                  static_cast<long long>(meta.dp), static_cast<long long>(meta.pp),
                  static_cast<long long>(meta.world_size), static_cast<long long>(deck_.parallel.dp),
                  static_cast<long long>(deck_.parallel.pp));
      std::fflush(stdout);
    }
    return;
  }
  if (!candidates.empty()) {
    throw InputError(cc.dir, "[checkpoint] resume",
                     "no checkpoint here could be loaded (last error: " + last_error +
                         "); set [checkpoint] resume = \"never\" to start afresh");
  }
}

void Trainer::save_checkpoint(int64_t step) {
  State& s = *st_;
  const auto t0 = Clock::now();
  const CheckpointStore store(deck_.checkpoint.dir);
  store.create_dir();
  CheckpointMeta meta;
  meta.step = step;
  meta.sample_position = s.cursor;
  meta.tokens_seen = s.cursor * s.cfg.seq_len;
  meta.epoch = s.order->epoch(s.cursor);
  meta.seed = deck_.train.seed;
  meta.dp = deck_.parallel.dp;
  meta.pp = deck_.parallel.pp;
  meta.world_size = deck_.parallel.dp * deck_.parallel.pp;
  meta.n_layer = s.cfg.n_layer;
  meta.n_head = s.cfg.n_head;
  meta.n_embd = s.cfg.n_embd;
  meta.seq_len = s.cfg.seq_len;
  meta.vocab_size = s.cfg.vocab_size;
  meta.tokenizer = s.train.tokenizer();
  meta.deck = deck_.to_toml();
  const std::string path = store.path_for_step(step);
  const auto slices = checkpoint_slices(
      s.cfg, s.stage->table(),
      StageState{s.stage->params(), s.opt->m().data(), s.opt->v().data()}, *s.grid);
  write_checkpoint(MPI_COMM_WORLD, path, meta, slices);
  if (rank_ == 0) {
    store.publish_latest(path);
    store.prune(deck_.checkpoint.keep);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double dt = seconds(t0, Clock::now());
  if (rank_ == 0) {
    const ParameterTable whole(s.cfg, StageRange{0, s.cfg.n_layer, true, true});
    const double mb = 3.0 * 4.0 * static_cast<double>(whole.total_numel()) / 1e6;
    std::printf("checkpoint: wrote %s (%.1f MB in %.2f s, %.0f MB/s)\n", path.c_str(), mb, dt,
                mb / dt);
    std::fflush(stdout);
  }
}

void Trainer::print_summary() const {
  const State& s = *st_;
  const TrainConfig& tc = deck_.train;
  const ProcessGrid& g = *s.grid;
  std::printf("mpiformer %s: resolved deck (%s)\n%s\n", MPIFORMER_VERSION, deck_.path.c_str(),
              deck_.to_toml().c_str());
  std::printf("train: %s (%s, %lld tokens, %lld windows, tokenizer %s)\n", s.train.path().c_str(),
              s.train.format().c_str(), static_cast<long long>(s.train.num_tokens()),
              static_cast<long long>(s.order->num_windows()), s.train.tokenizer().c_str());
  if (s.val) {
    std::printf("val:   %s (%lld tokens, %zu windows evaluated)\n", s.val->path().c_str(),
                static_cast<long long>(s.val->num_tokens()), s.eval_windows.size());
  }
  const ParameterTable whole(s.cfg, StageRange{0, s.cfg.n_layer, true, true});
  std::printf("model: %lld parameters, %lld layers, %lld heads, %lld channels, vocab %lld "
              "(padded %lld)\n",
              static_cast<long long>(whole.total_numel()), static_cast<long long>(s.cfg.n_layer),
              static_cast<long long>(s.cfg.n_head), static_cast<long long>(s.cfg.n_embd),
              static_cast<long long>(s.cfg.vocab_size),
              static_cast<long long>(s.cfg.padded_vocab()));
  std::printf("grid:  dp %d x pp %d, schedule %s, stage 0 holds layers [0, %lld); "
              "%d activation slot(s) on stage 0; %d gradient bucket(s)\n",
              g.dp(), g.pp(), deck_.parallel.schedule.c_str(),
              static_cast<long long>(s.stage->range().last_layer), s.stage->num_slots(),
              s.reducer->num_buckets());
  std::printf("step:  %lld sequences x %lld tokens = %lld micro-batches of %lld per replica; "
              "%d BLAS threads; peak %.1f GFLOP/s over %d rank(s) (%s)\n",
              static_cast<long long>(tc.global_batch), static_cast<long long>(s.cfg.seq_len),
              static_cast<long long>(deck_.grad_accum()), static_cast<long long>(tc.micro_batch),
              host::blas_threads(), s.peak_flops / 1e9, g.dp() * g.pp(),
              deck_.run.peak_tflops > 0 ? "[run] peak_tflops" : "sgemm 2048^3 measured now");
  std::fflush(stdout);
}

Trainer::StepResult Trainer::train_step(int64_t step, StepTimes& times, bool want_stop) {
  State& s = *st_;
  ProcessGrid& g = *s.grid;
  GptStage<float>& stage = *s.stage;
  TraceWriter& trace = *s.trace;
  const TrainConfig& tc = deck_.train;
  const int64_t B = tc.micro_batch, T = s.cfg.seq_len, C = s.cfg.n_embd;
  const int M = static_cast<int>(deck_.grad_accum());
  const int slots = stage.num_slots();
  const float grad_scale = 1.0f / static_cast<float>(tc.global_batch * T);
  MpiCommunicator& pipe = g.pipeline();

  // Sample j of the step lives at global position cursor + j, whichever
  // rank and micro-batch reads it: replica r's micro-batch m holds samples
  // (m * dp + r) * micro_batch + b. The cursor, not the step, is the data
  // position, so a resume with another global_batch continues exactly.
  auto load = [&](int micro, int slot) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t j = (static_cast<int64_t>(micro) * g.dp() + g.dp_rank()) * B + b;
      s.train.read_window(s.order->window(s.cursor + j), T, s.window.data());
      std::copy(s.window.begin(), s.window.end() - 1, s.inputs[slot].begin() + b * T);
      std::copy(s.window.begin() + 1, s.window.end(), s.targets[slot].begin() + b * T);
    }
  };

  stage.zero_grads();
  double loss_sum = 0;
  StepResult result{0, 0, 0, false};
  for (const Action& a : s.actions) {
    const int slot = a.micro >= 0 ? a.micro % slots : 0;
    const auto t0 = Clock::now();
    switch (a.op) {
      case Op::RecvActivation:
        pipe.recv(stage.input_buffer(slot), B * T * C, g.stage() - 1, activation_tag(a.micro));
        times.recv_wait += seconds(t0, Clock::now());
        break;
      case Op::Forward:
        // The slot's previous occupant may still be on its way downstream.
        if (s.act_sends[slot]) s.act_sends[slot].reset();
        load(a.micro, slot);
        loss_sum += stage.forward(slot, s.inputs[slot].data(),
                                  g.first_stage() ? nullptr : stage.input_buffer(slot),
                                  s.targets[slot].data(), true, grad_scale);
        break;
      case Op::SendActivation:
        s.act_sends[slot] = pipe.start_send(stage.output(slot), B * T * C, g.stage() + 1,
                                            activation_tag(a.micro));
        break;
      case Op::RecvGradient:
        pipe.recv(s.grad_in.data(), B * T * C, g.stage() + 1, gradient_tag(a.micro));
        times.recv_wait += seconds(t0, Clock::now());
        break;
      case Op::Backward: {
        // The last micro-batch's backward finishes the gradients: reduce
        // each bucket across replicas as soon as it is final.
        const bool overlap = a.micro == M - 1 && g.dp() > 1;
        if (overlap) s.reducer->begin(stage.grads());
        stage.backward(slot, s.inputs[slot].data(), g.last_stage() ? nullptr : s.grad_in.data(),
                       overlap ? GptStage<float>::GradsFinal([&](int64_t offset) {
                         s.reducer->grads_final_from(offset);
                       })
                               : nullptr);
        break;
      }
      case Op::SendGradient:
        if (s.grad_sends[slot]) s.grad_sends[slot].reset();
        std::memcpy(s.grad_out[slot].data(), stage.input_grad(), sizeof(float) * B * T * C);
        s.grad_sends[slot] = pipe.start_send(s.grad_out[slot].data(), B * T * C, g.stage() - 1,
                                             gradient_tag(a.micro));
        break;
      case Op::ReduceGradients:
        if (g.dp() > 1) times.reduce_exposed += s.reducer->finish();
        // The two copies of the tied embedding receive the sum of both
        // stages' gradients, so identical updates keep them identical.
        if (MpiCommunicator* tied = g.tied_embedding()) {
          const auto& wte = stage.table().at("wte");
          tied->allreduce_sum(stage.grads() + wte.offset, wte.storage);
        }
        break;
      case Op::OptimizerStep: {
        // Each parameter counted once: one replica per stage, and the tied
        // embedding only on the first stage. The stop votes ride along, so
        // agreeing on preemption costs no extra collective.
        double sums[3] = {loss_sum, 0.0, want_stop || stop_signal() != 0 ? 1.0 : 0.0};
        if (g.dp_rank() == 0) {
          sums[1] = host::sum_of_squares(stage.grads(), stage.param_storage());
          if (g.pp() > 1 && g.last_stage()) {
            const auto& wte = stage.table().at("wte");
            sums[1] -= host::sum_of_squares(stage.grads() + wte.offset, wte.storage);
          }
        }
        g.world().allreduce_sum(sums, 3);
        loss_sum = sums[0];
        result.stop = sums[2] > 0;
        const double norm = std::sqrt(std::max(sums[1], 0.0));
        const double clip = (tc.grad_clip > 0 && norm > tc.grad_clip) ? tc.grad_clip / norm : 1.0;
        const double lr = learning_rate(tc.lr, tc.min_lr, tc.warmup_steps, tc.steps, step);
        s.opt->update(stage.params(), stage.grads(), lr, step + 1, clip);
        result.grad_norm = norm;
        result.lr = lr;
        break;
      }
    }
    trace.span(op_name(a.op), t0, Clock::now(), step + 1, a.micro);
  }
  for (auto& p : s.act_sends) p.reset();
  for (auto& p : s.grad_sends) p.reset();
  trace.flush();
  result.loss = loss_sum / static_cast<double>(tc.global_batch * T);
  s.cursor += tc.global_batch;
  return result;
}

double Trainer::evaluate() {
  State& s = *st_;
  ProcessGrid& g = *s.grid;
  GptStage<float>& stage = *s.stage;
  const int64_t B = deck_.train.micro_batch, T = s.cfg.seq_len, C = s.cfg.n_embd;
  // Evaluation micro-batch k goes to replica k % dp; forward only, one at a
  // time, through slot 0.
  const int local = static_cast<int>(s.eval_windows.size() / (B * g.dp()));
  double sum = 0;
  for (const Action& a : forward_only_schedule(g.pp(), g.stage(), local)) {
    switch (a.op) {
      case Op::RecvActivation:
        g.pipeline().recv(stage.input_buffer(0), B * T * C, g.stage() - 1, activation_tag(a.micro));
        break;
      case Op::Forward: {
        const int64_t k = static_cast<int64_t>(a.micro) * g.dp() + g.dp_rank();
        for (int64_t b = 0; b < B; ++b) {
          s.val->read_window(s.eval_windows[k * B + b], T, s.window.data());
          std::copy(s.window.begin(), s.window.end() - 1, s.inputs[0].begin() + b * T);
          std::copy(s.window.begin() + 1, s.window.end(), s.targets[0].begin() + b * T);
        }
        sum += stage.forward(0, s.inputs[0].data(),
                             g.first_stage() ? nullptr : stage.input_buffer(0),
                             s.targets[0].data(), false, 0.0f);
        break;
      }
      case Op::SendActivation:
        // Waited at once: slot 0 is overwritten by the next forward.
        g.pipeline()
            .start_send(stage.output(0), B * T * C, g.stage() + 1, activation_tag(a.micro))
            ->wait();
        break;
      default:
        break;
    }
  }
  g.world().allreduce_sum(&sum, 1);
  return sum / static_cast<double>(s.eval_windows.size() * T);
}

void Trainer::check_tied_embedding() {
  State& s = *st_;
  MpiCommunicator* tied = s.grid->tied_embedding();
  if (tied == nullptr) return;
  // The last stage sends its copy; the first compares bit for bit.
  const auto& wte = s.stage->table().at("wte");
  float* mine = s.stage->params() + wte.offset;
  if (tied->rank() == 1) {
    tied->start_send(mine, wte.storage, 0, 0)->wait();
    return;
  }
  std::vector<float> theirs(static_cast<size_t>(wte.storage));
  tied->recv(theirs.data(), wte.storage, 1, 0);
  if (std::memcmp(theirs.data(), mine, sizeof(float) * theirs.size()) != 0) {
    throw SystemError("the tied embedding's copies on the first and last stage differ");
  }
  if (rank_ == 0) std::printf("tied embedding: first and last stage copies are identical\n");
}

TrainResult Trainer::run() {
  State& s = *st_;
  const TrainConfig& tc = deck_.train;
  const ProcessGrid& g = *s.grid;
  const bool lead = rank_ == 0;
  if (lead) print_summary();
  MetricsLog log(deck_.run.dir, lead, s.resumed);
  const int64_t end_step = tc.stop_at > 0 ? std::min(tc.stop_at, tc.steps) : tc.steps;
  if (lead && s.start_step >= end_step) {
    std::printf("nothing to do: the checkpoint is at step %lld, this run ends at step %lld\n",
                static_cast<long long>(s.start_step), static_cast<long long>(end_step));
  }

  TrainResult result;
  result.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  const int64_t M = deck_.grad_accum();
  // The time guard: stop (with a checkpoint) before a step would run past
  // the deadline, the earlier of [run] time_limit and Slurm's end time.
  const auto run_start = Clock::now();
  double deadline_s = deck_.run.time_limit > 0 ? deck_.run.time_limit : 1e300;
  if (const char* end = std::getenv("SLURM_JOB_END_TIME")) {
    const double left = std::atof(end) - static_cast<double>(std::time(nullptr));
    if (std::atof(end) > 0) deadline_s = std::min(deadline_s, left);
  }
  double total_step_s = 0, last_save_s = 0;
  int64_t steps_run = 0;
  double interval_s = 0;
  int64_t interval_steps = 0;
  StepTimes times;
  host::reset_gemm_seconds();
  for (int64_t step = s.start_step; step < end_step; ++step) {
    const auto t0 = Clock::now();
    // Time for this step and a save after the next, with 20% to spare; a
    // save not yet measured is guessed at 100 MB/s.
    const double mean_step = steps_run > 0 ? total_step_s / static_cast<double>(steps_run) : 0;
    const double save_guess =
        last_save_s > 0 ? last_save_s : 12.0 * static_cast<double>(s.stage->param_storage()) / 1e8;
    const bool out_of_time =
        seconds(run_start, t0) + 1.2 * (2 * mean_step + save_guess) > deadline_s;
    const StepResult r = train_step(step, times, out_of_time);
    const double step_s = seconds(t0, Clock::now());
    interval_s += step_s;
    total_step_s += step_s;
    ++steps_run;
    ++interval_steps;
    result.losses.push_back(r.loss);
    if (!std::isfinite(r.loss)) {
      throw SystemError(strprintf("loss is %g at step %lld: training diverged (lower [train] lr?)",
                                  r.loss, static_cast<long long>(step + 1)));
    }
    const int64_t done = step + 1;
    if (done % tc.log_every == 0 || done == end_step) {
      // Means over the interval and over ranks (one small all-reduce).
      double agg[2] = {times.recv_wait / interval_s, times.reduce_exposed};
      s.grid->world().allreduce_sum(agg, 2);
      const int ranks = g.dp() * g.pp();
      const double mean_s = interval_s / static_cast<double>(interval_steps);
      StepMetrics sm;
      sm.step = done;
      sm.steps = tc.steps;
      sm.loss = r.loss;
      sm.lr = r.lr;
      sm.grad_norm = r.grad_norm;
      sm.step_ms = 1e3 * mean_s;
      sm.tokens_per_s = static_cast<double>(tc.global_batch * s.cfg.seq_len) / mean_s;
      sm.mfu = sm.tokens_per_s * s.flops_per_token / s.peak_flops;
      sm.eta_s = mean_s * static_cast<double>(end_step - done);
      sm.samples = s.cursor;
      sm.matmul_fraction = host::gemm_seconds() / interval_s;
      sm.pipelined = g.pp() > 1;
      sm.bubble = agg[0] / ranks;
      sm.bubble_theory = static_cast<double>(g.pp() - 1) / static_cast<double>(M + g.pp() - 1);
      sm.data_parallel = g.dp() > 1;
      sm.reduce_exposed_ms = 1e3 * agg[1] / ranks / static_cast<double>(interval_steps);
      log.step(sm);
      host::reset_gemm_seconds();
      interval_s = 0;
      interval_steps = 0;
      times = StepTimes{};
    }
    const bool eval_due = tc.eval_every > 0 && done % tc.eval_every == 0;
    if (s.val && (eval_due || done == tc.steps)) {
      result.final_val_loss = evaluate();
      host::reset_gemm_seconds();  // evaluation is not part of the next interval
      log.eval(done, tc.steps, result.final_val_loss);
    }
    const int64_t every = deck_.checkpoint.every;
    if ((every > 0 && done % every == 0) || done == end_step || r.stop) {
      const auto ts = Clock::now();
      save_checkpoint(done);
      last_save_s = seconds(ts, Clock::now());
    }
    if (r.stop && done < end_step) {
      result.stopped_to_requeue = true;
      if (lead) {
        const int sig = stop_signal();
        std::printf("stopping after step %lld to be requeued (%s); exit code %d\n",
                    static_cast<long long>(done),
                    sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "time limit",
                    kExitRequeue);
        std::fflush(stdout);
      }
      return result;
    }
  }
  check_tied_embedding();
  if (lead && s.val && end_step == tc.steps && s.start_step < end_step) {
    std::printf("final val loss %.4f after %lld steps\n", result.final_val_loss,
                static_cast<long long>(tc.steps));
  }
  return result;
}

}  // namespace mpiformer
