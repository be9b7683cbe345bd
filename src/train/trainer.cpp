#include "train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.hpp"
#include "core/format.hpp"
#include "host/adamw.hpp"
#include "host/gemm.hpp"
#include "model/gpt_stage.hpp"
#include "token_dataset.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/lr_schedule.hpp"
#include "train/metrics_log.hpp"
#include "train/model_flops.hpp"
#include "train/sample_order.hpp"

namespace mpiformer {

using Clock = std::chrono::steady_clock;

struct Trainer::State {
  TokenDataset train;
  std::unique_ptr<TokenDataset> val;
  GptConfig cfg;
  std::unique_ptr<GptStage<float>> stage;
  std::unique_ptr<AdamWOptimizer<float>> opt;
  std::unique_ptr<SampleOrder> order;
  std::vector<int64_t> eval_windows;
  // One micro-batch: windows of T+1 tokens, split into inputs and targets.
  std::vector<int32_t> window, inputs, targets;
  double flops_per_token = 0, peak_flops = 0;
  explicit State(const std::string& train_path) : train(train_path) {}
};

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
  if (world != 1) {
    throw InputError(deck_.path, "[parallel] dp x pp",
                     "this version trains on one rank (dp = pp = 1); data and pipeline "
                     "parallelism are not implemented yet");
  }
}

Trainer::~Trainer() = default;

TrainResult Trainer::run() {
  State& s = *st_;
  const GptConfig& cfg = s.cfg;
  const TrainConfig& tc = deck_.train;
  const int64_t B = tc.micro_batch, T = cfg.seq_len, M = deck_.grad_accum();
  const bool lead = rank_ == 0;
  if (deck_.run.blas_threads > 0) host::set_blas_threads(static_cast<int>(deck_.run.blas_threads));

  s.stage = std::make_unique<GptStage<float>>(cfg, partition_stage(cfg, 0, 1), B, 1);
  s.stage->init_parameters(static_cast<uint64_t>(tc.seed));
  s.opt = std::make_unique<AdamWOptimizer<float>>(
      s.stage->table(), AdamWSettings{tc.beta1, tc.beta2, tc.eps, tc.weight_decay});
  s.order = std::make_unique<SampleOrder>(s.train.num_windows(T), static_cast<uint64_t>(tc.seed));
  s.window.resize(T + 1);
  s.inputs.resize(B * T);
  s.targets.resize(B * T);
  s.flops_per_token = training_flops_per_token(cfg);
  s.peak_flops = deck_.run.peak_tflops > 0 ? deck_.run.peak_tflops * 1e12 : measure_sgemm_peak();

  // A fixed evaluation set: eval_batches global batches of windows spread
  // evenly over the validation data, whole micro-batches only.
  if (s.val) {
    const int64_t have = s.val->num_windows(T);
    int64_t want = std::min(tc.eval_batches * tc.global_batch, have);
    want -= want % B;
    if (want == 0) {
      throw InputError(s.val->path(), "[data] val",
                       strprintf("%lld windows of %lld tokens: fewer than one micro-batch (%lld)",
                                 static_cast<long long>(have), static_cast<long long>(T + 1),
                                 static_cast<long long>(B)));
    }
    for (int64_t k = 0; k < want; ++k) s.eval_windows.push_back(k * have / want);
  }

  MetricsLog log(deck_.run.dir, lead);
  if (lead) {
    std::printf("mpiformer %s: resolved deck (%s)\n%s\n", MPIFORMER_VERSION, deck_.path.c_str(),
                deck_.to_toml().c_str());
    std::printf("train: %s (%s, %lld tokens, %lld windows, tokenizer %s)\n", s.train.path().c_str(),
                s.train.format().c_str(), static_cast<long long>(s.train.num_tokens()),
                static_cast<long long>(s.order->num_windows()), s.train.tokenizer().c_str());
    if (s.val) {
      std::printf("val:   %s (%lld tokens, %zu windows evaluated)\n", s.val->path().c_str(),
                  static_cast<long long>(s.val->num_tokens()), s.eval_windows.size());
    }
    std::printf("model: %lld parameters, %lld layers, %lld heads, %lld channels, vocab %lld "
                "(padded %lld)\n",
                static_cast<long long>(s.stage->table().total_numel()),
                static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_head),
                static_cast<long long>(cfg.n_embd), static_cast<long long>(cfg.vocab_size),
                static_cast<long long>(cfg.padded_vocab()));
    std::printf("step:  %lld sequences x %lld tokens = %lld micro-batches of %lld; "
                "%d BLAS threads; peak %.1f GFLOP/s (%s)\n",
                static_cast<long long>(tc.global_batch), static_cast<long long>(T),
                static_cast<long long>(M), static_cast<long long>(B), host::blas_threads(),
                s.peak_flops / 1e9, deck_.run.peak_tflops > 0 ? "[run] peak_tflops" : "sgemm 2048^3 measured now");
    std::fflush(stdout);
  }

  auto load = [&](int64_t row, int64_t window, const TokenDataset& data) {
    const TokenDataset& d = data;
    d.read_window(window, T, s.window.data());
    std::copy(s.window.begin(), s.window.end() - 1, s.inputs.begin() + row * T);
    std::copy(s.window.begin() + 1, s.window.end(), s.targets.begin() + row * T);
  };
  auto evaluate = [&]() {
    double sum = 0;
    for (size_t first = 0; first < s.eval_windows.size(); first += B) {
      for (int64_t b = 0; b < B; ++b) load(b, s.eval_windows[first + b], *s.val);
      sum += s.stage->forward(0, s.inputs.data(), nullptr, s.targets.data(), false, 0.0f);
    }
    return sum / static_cast<double>(s.eval_windows.size() * T);
  };

  TrainResult result;
  result.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  const float grad_scale = 1.0f / static_cast<float>(tc.global_batch * T);
  const int64_t storage = s.stage->param_storage();
  double interval_s = 0;
  int64_t interval_steps = 0;
  host::reset_gemm_seconds();
  for (int64_t step = 0; step < tc.steps; ++step) {
    const auto t0 = Clock::now();
    s.stage->zero_grads();
    double loss_sum = 0;
    for (int64_t m = 0; m < M; ++m) {
      // Sample j of the step lives at global position step*global_batch + j,
      // whichever rank and micro-batch reads it.
      for (int64_t b = 0; b < B; ++b) {
        const int64_t pos = step * tc.global_batch + m * B + b;
        load(b, s.order->window(pos), s.train);
      }
      loss_sum += s.stage->forward(0, s.inputs.data(), nullptr, s.targets.data(), true, grad_scale);
      s.stage->backward(0, s.inputs.data(), nullptr);
    }
    const double loss = loss_sum / static_cast<double>(tc.global_batch * T);
    const double norm = std::sqrt(host::sum_of_squares(s.stage->grads(), storage));
    const double clip = (tc.grad_clip > 0 && norm > tc.grad_clip) ? tc.grad_clip / norm : 1.0;
    const double lr = learning_rate(tc.lr, tc.min_lr, tc.warmup_steps, tc.steps, step);
    s.opt->update(s.stage->params(), s.stage->grads(), lr, step + 1, clip);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    result.losses.push_back(loss);
    if (!std::isfinite(loss)) {
      throw SystemError(strprintf("loss is %g at step %lld: training diverged (lower [train] lr?)",
                                  loss, static_cast<long long>(step + 1)));
    }
    interval_s += dt;
    ++interval_steps;
    const int64_t done = step + 1;
    if (done % tc.log_every == 0 || done == tc.steps) {
      StepMetrics sm;
      sm.step = done;
      sm.steps = tc.steps;
      sm.loss = loss;
      sm.lr = lr;
      sm.grad_norm = norm;
      const double mean_s = interval_s / static_cast<double>(interval_steps);
      sm.step_ms = 1e3 * mean_s;
      sm.tokens_per_s = static_cast<double>(tc.global_batch * T) / mean_s;
      sm.mfu = sm.tokens_per_s * s.flops_per_token / s.peak_flops;
      sm.eta_s = mean_s * static_cast<double>(tc.steps - done);
      sm.matmul_fraction = host::gemm_seconds() / interval_s;
      log.step(sm);
      host::reset_gemm_seconds();
      interval_s = 0;
      interval_steps = 0;
    }
    const bool eval_due = tc.eval_every > 0 && done % tc.eval_every == 0;
    if (s.val && (eval_due || done == tc.steps)) {
      result.final_val_loss = evaluate();
      host::reset_gemm_seconds();  // evaluation is not part of the next interval
      log.eval(done, tc.steps, result.final_val_loss);
    }
  }
  if (lead && s.val) {
    std::printf("final val loss %.4f after %lld steps\n", result.final_val_loss,
                static_cast<long long>(tc.steps));
  }
  return result;
}

}  // namespace mpiformer
