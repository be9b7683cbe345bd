#include "train/trainer.hpp"

#include "train/trainer_state.hpp"

namespace mpiformer {

namespace {

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


}  // namespace

Trainer::Trainer(Deck deck, int rank, int world) : deck_(std::move(deck)), rank_(rank) {
  const int local_rank = node_local_rank(MPI_COMM_WORLD);
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    open_inputs(world);
    st_->backend = choose_backend(deck_, local_rank);
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
  const StageRange range = partition_stage(s.cfg, stage_index, pp);
  const AdamWSettings adam{tc.beta1, tc.beta2, tc.eps, tc.weight_decay};
  if (s.backend.device == "cuda") {
#ifdef MPIFORMER_HAVE_CUDA
    try {
      s.stage = make_cuda_backend(s.cfg, range, B, slots, adam, s.backend);
    } catch (const SystemError& e) {
      if (std::string(e.what()).find("out of memory") == std::string::npos) throw;
      throw InputError(deck_.path, "[train] micro_batch",
                       strprintf("stage %d does not fit in GPU memory with micro_batch %lld and "
                                 "%d activation slot(s): lower micro_batch or raise pp (%s)",
                                 stage_index, static_cast<long long>(B), slots, e.what()));
    }
#endif
  } else {
    s.stage = make_host_backend(s.cfg, range, B, slots, adam);
  }
  s.stage->init_parameters(static_cast<uint64_t>(tc.seed));
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
  s.inputs.assign(slots, std::vector<int32_t>(B * T));
  s.targets.assign(slots, std::vector<int32_t>(B * T));
  s.act_sends.resize(slots);
  s.grad_sends.resize(slots);
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
  ProcessGrid& g = *s.grid;
  // "auto" resolves node by node: a job whose nodes differ would run half
  // on GPUs and disagree on every message. The same verdict on every rank.
  double on_gpu[2] = {s.stage->on_device() ? 1.0 : 0.0, 1.0};
  g.world().allreduce_sum(on_gpu, 2);
  if (on_gpu[0] != 0 && on_gpu[0] != on_gpu[1]) {
    throw InputError(deck_.path, "[run] device",
                     strprintf("\"%s\" put %.0f of %.0f ranks on a GPU: every rank must run on "
                               "the same kind of device (set \"cuda\" or \"cpu\")",
                               deck_.run.device.c_str(), on_gpu[0], on_gpu[1]));
  }
  s.pipe_act = s.pipe_grad = &g.pipeline();
  s.dp = &g.data_parallel();
  s.tied = g.tied_embedding();
  if (s.stage->on_device()) connect_device();
  s.reducer = std::make_unique<GradReducer>(s.stage->table(), deck_.parallel.bucket_mb * (1 << 20),
                                            *s.dp);
  // Every rank measures its own peak; MFU compares against their sum.
  double peak = deck_.run.peak_tflops > 0 ? deck_.run.peak_tflops * 1e12
                                          : s.stage->measure_peak_flops();
  s.grid->world().allreduce_sum(&peak, 1);
  s.peak_flops = peak;
  resume();
}

void Trainer::connect_device() {
#ifdef MPIFORMER_HAVE_CUDA
  State& s = *st_;
  ProcessGrid& g = *s.grid;
  void* stream = s.stage->device_stream();
  // Every rank builds its groups in the same order (data-parallel, then the
  // two pipeline directions, then the tied pair), so the collective
  // initialisations cannot wait on each other. Groups of one rank never
  // carry a message and keep the MPI communicator.
  auto device_comm = [&](MpiCommunicator& group, const char* what) -> Communicator* {
    if (group.size() == 1) return &group;
    s.comms_kind += s.comms_kind.empty() ? "" : ", ";
#ifdef MPIFORMER_HAVE_NCCL
    if (!group_shares_a_gpu(group)) {
      s.device_comms.push_back(std::make_unique<NcclCommunicator>(group, stream));
      s.comms_kind += strprintf("%s: NCCL (%d ranks)", what, group.size());
      return s.device_comms.back().get();
    }
    const char* why = "ranks share a GPU";
#else
    const char* why = "built without NCCL";
#endif
    s.device_comms.push_back(std::make_unique<HostStagedCommunicator>(group, stream));
    s.comms_kind += strprintf("%s: MPI through host memory (%d ranks; %s)", what, group.size(), why);
    return s.device_comms.back().get();
  };
  s.dp = device_comm(g.data_parallel(), "data-parallel");
  s.pipe_act = device_comm(g.pipeline(), "activations");
  s.pipe_grad = device_comm(g.pipeline(), "gradients");
  if (MpiCommunicator* tied = g.tied_embedding()) s.tied = device_comm(*tied, "tied embedding");
#endif
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
  const bool gpu = s.stage->on_device();
  std::printf("device: %s on rank 0%s%s%s\n", s.stage->describe().c_str(),
              gpu ? "" : " (", gpu ? "" : s.backend.why_cpu.c_str(), gpu ? "" : ")");
  if (!s.comms_kind.empty()) std::printf("comms: %s on rank 0\n", s.comms_kind.c_str());
  std::printf("step:  %lld sequences x %lld tokens = %lld micro-batches of %lld per replica; "
              "%d BLAS threads; peak %.1f GFLOP/s over %d rank(s) (%s)\n",
              static_cast<long long>(tc.global_batch), static_cast<long long>(s.cfg.seq_len),
              static_cast<long long>(deck_.grad_accum()), static_cast<long long>(tc.micro_batch),
              host::blas_threads(), s.peak_flops / 1e9, g.dp() * g.pp(),
              deck_.run.peak_tflops > 0 ? "[run] peak_tflops"
              : gpu ? (s.backend.precision == "bf16" ? "cuBLASLt bf16 GEMM 8192^3 measured now"
                                                     : "cuBLASLt fp32 GEMM 8192^3 measured now")
                    : "sgemm 2048^3 measured now");
  std::fflush(stdout);
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
  s.stage->reset_gemm_seconds();
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
      sm.matmul_fraction = s.stage->gemm_seconds() / interval_s;
      sm.pipelined = g.pp() > 1;
      sm.bubble = agg[0] / ranks;
      sm.bubble_theory = static_cast<double>(g.pp() - 1) / static_cast<double>(M + g.pp() - 1);
      sm.data_parallel = g.dp() > 1;
      sm.reduce_exposed_ms = 1e3 * agg[1] / ranks / static_cast<double>(interval_steps);
      sm.host_timings = !s.stage->on_device();
      log.step(sm);
      s.stage->reset_gemm_seconds();
      interval_s = 0;
      interval_steps = 0;
      times = StepTimes{};
    }
    const bool eval_due = tc.eval_every > 0 && done % tc.eval_every == 0;
    if (s.val && (eval_due || done == tc.steps)) {
      result.final_val_loss = evaluate();
      s.stage->reset_gemm_seconds();  // evaluation is not part of the next interval
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
