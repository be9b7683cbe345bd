// End-to-end step benchmark: a few optimizer steps of the model a deck
// describes (synthetic tokens, no dataset needed), with
//  - model FLOP/s against the sgemm peak measured in the same run,
//  - the split of the step into GEMMs and everything else,
//  - the time of every labelled host kernel (Kokkos profiling hooks).
// Usage: mpiformer_bench_step DECK [--set k=v]... [--steps N] [--json FILE]
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mpi.h>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "deck.hpp"
#include "host/gemm.hpp"
#include "host/parallel.hpp"
#include "model/model_flops.hpp"
#include "train/stage_backend.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Kernel time by label, from the host loops' observer (kernels/host/parallel.hpp).
struct KernelTimes {
  std::vector<std::pair<std::string, Clock::time_point>> open;
  std::map<std::string, double> seconds;
};
KernelTimes g_times;

void on_begin(const char* name) { g_times.open.emplace_back(name, Clock::now()); }
void on_end() {
  const auto& [name, t0] = g_times.open.back();
  g_times.seconds[name] += std::chrono::duration<double>(Clock::now() - t0).count();
  g_times.open.pop_back();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mpiformer;
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    std::string deck_path, json_path;
    std::vector<std::string> sets;
    int steps = 3;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--set" && i + 1 < argc) sets.push_back(argv[++i]);
      else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
      else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
      else deck_path = a;
    }
    const Deck deck = load_deck(deck_path, sets);
    GptConfig cfg = deck.model;
    if (cfg.vocab_size == 0) cfg.vocab_size = 50257;
    host::set_compute_threads(host::choose_compute_threads(static_cast<int>(deck.run.blas_threads), 1));
    const int64_t B = deck.train.micro_batch, T = cfg.seq_len;

    // The trainer's own stage and optimizer on the host.
    StageSetup setup;
    setup.options = stage_options(B, SlotKinds::any(1), deck.train.recompute, 0);
    setup.adam = AdamWSettings{0.9, 0.95, 1e-8, 0.1};
    setup.precision = deck.train.precision;
    const auto stage = make_host_backend(cfg, partition_stage(cfg, 0, 1), setup);
    stage->init_parameters(1);
    std::vector<int32_t> tokens(B * (T + 1));
    Rng rng(7, "bench");
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
    std::vector<int32_t> inputs(B * T), targets(B * T);
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(tokens.begin() + b * (T + 1), T, inputs.begin() + b * T);
      std::copy_n(tokens.begin() + b * (T + 1) + 1, T, targets.begin() + b * T);
    }
    auto step = [&](int64_t n) {
      stage->zero_grads();
      stage->forward(0, inputs.data(), targets.data(), true, 1.0f / (B * T), 0);
      stage->backward(0, false, 0);
      stage->take_loss_sum();
      const double norm = std::sqrt(stage->grad_sum_of_squares(false, false));
      stage->adamw_step(1e-4, n, norm > 1 ? 1 / norm : 1);
    };
    step(1);  // warm-up: page faults, BLAS buffers

    const double peak = stage->measure_peak_flops();
    host::loop_observer() = host::LoopObserver{on_begin, on_end};
    host::reset_gemm_seconds();
    const auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) step(2 + s);
    const double total = std::chrono::duration<double>(Clock::now() - t0).count();
    const double per_step = total / steps;
    const double gemm = host::gemm_seconds() / steps;
    const double tok_s = static_cast<double>(B * T) / per_step;
    const double flops = tok_s * training_flops_per_token(cfg);

    std::printf("model   %lld layers, %lld channels, vocab %lld, micro-batch %lld x %lld tokens, "
                "%d BLAS threads\n",
                (long long)cfg.n_layer, (long long)cfg.n_embd, (long long)cfg.vocab_size,
                (long long)B, (long long)T, host::blas_threads());
    std::printf("step    %.1f ms, %.0f tokens/s\n", 1e3 * per_step, tok_s);
    std::printf("model   %.1f GFLOP/s = %.1f%% of the %s GEMM peak %.1f GFLOP/s measured now\n",
                flops / 1e9, 100 * flops / peak, name_of(deck.train.precision), peak / 1e9);
    std::printf("split   GEMM %.1f%%, everything else %.1f%% of the step\n", 100 * gemm / per_step,
                100 * (per_step - gemm) / per_step);
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, sec] : g_times.seconds) rows.emplace_back(sec / steps, name);
    std::sort(rows.rbegin(), rows.rend());
    std::printf("kernels (ms per step; attention includes its GEMMs)\n");
    for (const auto& [sec, name] : rows)
      std::printf("  %-32s %9.2f  %5.1f%%\n", name.c_str(), 1e3 * sec, 100 * sec / per_step);
    if (!json_path.empty()) {
      if (std::FILE* f = std::fopen(json_path.c_str(), "w")) {
        std::fprintf(f,
                     "{\"precision\": \"%s\", \"n_layer\": %lld, \"n_embd\": %lld, \"micro_batch\": %lld, \"seq_len\": %lld, "
                     "\"step_ms\": %.3f, \"tokens_per_s\": %.2f, \"model_gflops\": %.3f, "
                     "\"peak_gflops\": %.3f, \"fraction_of_peak\": %.4f, \"non_matmul_fraction\": %.4f}\n",
                     name_of(deck.train.precision), (long long)cfg.n_layer, (long long)cfg.n_embd,
                     (long long)B, (long long)T, 1e3 * per_step, tok_s, flops / 1e9, peak / 1e9, flops / peak,
                     (per_step - gemm) / per_step);
        std::fclose(f);
      } else {
        rc = 1;
      }
    }
  }
  MPI_Finalize();
  return rc;
}
