#include "plan/layout_search.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <tuple>
#include <thread>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/layer_chunks.hpp"

namespace mpiformer {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Micro-batches worth trying: powers of two dividing the per-replica
// batch, and the deck's own (beyond a few the rate no longer changes and
// the enumeration would grow with the batch).
std::vector<int64_t> micro_batches(int64_t per_replica, int64_t deck_value) {
  std::vector<int64_t> m;
  for (int64_t b = 1; b <= per_replica && b <= 1024; b *= 2)
    if (per_replica % b == 0) m.push_back(b);
  if (per_replica % deck_value == 0 && std::find(m.begin(), m.end(), deck_value) == m.end())
    m.push_back(deck_value);
  return m;
}

// Context parallelism where a run could take it: a sequence that cuts
// into 2 cp chunks.
bool context_parallel_allowed(const Deck& deck, int64_t cp) { return deck.model.seq_len % (2 * cp) == 0; }

}  // namespace

Plan plan_layouts(const Deck& deck, const MachineSpec& machine, int ranks, int ranks_per_node,
                  const PlanOptions& options) {
  Plan plan;
  plan.ranks = ranks;
  const GptConfig& cfg = deck.model;
  const int64_t node = ranks_per_node > 0 ? ranks_per_node : machine.devices_per_node;
  require_rates_for(deck, machine);
  // Every layout first (cheap), then each priced: the pricing walks the
  // schedule of every micro-batch, which at tens of thousands of ranks and
  // thousands of micro-batches is most of the time.
  std::vector<Layout> layouts;
  for (int64_t tp : divisors(ranks)) {
    // Tensor groups stay inside a node (their all-reduces are in every
    // block), whole: a node's ranks are a multiple of the group.
    if (cfg.n_head % tp != 0 || !cfg.kv_heads_split(tp) || cfg.ffn() % tp != 0 ||
        (tp > 1 && node % tp != 0))
      continue;
    for (int64_t pp : divisors(ranks / tp)) {
      if (pp > cfg.n_layer) continue;
      // The stage's replicas: dp data replicas of cp context ranks each.
      for (int64_t cp : divisors(ranks / (tp * pp))) {
        if (cp > 1 && !context_parallel_allowed(deck, cp)) continue;
        const int64_t dp = ranks / (tp * pp * cp);
        if (deck.train.global_batch % dp != 0) continue;
        // A Mixture of Experts' experts shared out over ep replicas: ep
        // dividing both the replicas (dp x cp) and the experts.
        for (int64_t ep : divisors(dp * cp)) {
          if (ep > 1 && (!cfg.moe() || cfg.experts % ep != 0)) continue;
          for (int64_t mb : micro_batches(deck.train.global_batch / dp, deck.train.micro_batch)) {
            // Compressed gradients are zero 0's, 16-bit gradients zero
            // 1-3's (deck rules).
            const bool compressed = deck.train.grad_compression != GradCompression::kNone;
            const int64_t first_zero = deck.train.grad_dtype == GradDtype::kBf16 ? 1 : 0;
            for (int64_t zero = first_zero; zero <= (dp * cp > 1 && !compressed ? 3 : first_zero);
                 ++zero) {
              for (Recompute rc : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
                for (ScheduleKind sk :
                     {ScheduleKind::kOneFOneB, ScheduleKind::kGPipe, ScheduleKind::kZbH1}) {
                  // At pp 1 every schedule is the same walk; zb-h1's W reads
                  // what full recomputation does not keep (the deck refuses it).
                  if (pp == 1 && sk != ScheduleKind::kOneFOneB) continue;
                  if (splits_backward(sk) && rc == Recompute::kFull) continue;
                  for (bool sp : {false, true}) {
                    // Sequence parallelism where the rows divide among the group.
                    if (sp && (tp == 1 || cfg.seq_len % tp != 0)) continue;
                    // Sequence parallelism's rows: a cp-th of each sequence's.
                    if (sp && (cfg.seq_len / cp) % tp != 0) continue;
                    layouts.push_back(
                        Layout{dp, pp, tp, mb, zero, rc, sk, sp, 1, deck.train.offload, ep, cp});
                    // Interleaved 1F1B, with 2 and 4 chunks per stage where the
                    // layers cut into them (evenly, or with the first and last
                    // chunks shorter) and the micro-batches come in rounds of
                    // pp (the deck's rules).
                    if (sk != ScheduleKind::kOneFOneB || pp == 1) continue;
                    const int64_t micro = deck.train.global_batch / (dp * mb);
                    for (int64_t v : {2, 4}) {
                      if (!layer_chunks(cfg.n_layer, pp, v).refusal.empty() || micro % pp != 0) continue;
                      layouts.push_back(Layout{dp, pp, tp, mb, zero, rc, ScheduleKind::kInterleaved,
                                               sp, v, deck.train.offload, ep, cp});
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  if (layouts.empty()) {
    throw InputError(deck.path, "[train] global_batch",
                     strprintf("no layout of %d ranks divides it (%lld sequences): dp must divide "
                               "the global batch, tp the heads (%lld), pp at most the layers (%lld)",
                               ranks, static_cast<long long>(deck.train.global_batch),
                               static_cast<long long>(cfg.n_head),
                               static_cast<long long>(cfg.n_layer)));
  }
  // Priced side by side (each prediction is independent and pure), into
  // their own slots, so the result is the same whatever the threads.
  auto price = [&](const std::vector<Layout>& candidates) {
    const int total = static_cast<int>(candidates.size());
    std::vector<Prediction> priced(candidates.size());
    std::mutex mutex;  // guards what follows, for the progress reports
    int done = 0;
    Prediction best;
    // The tokens/s of the fastest `keep` timed so far, fastest first: a
    // layout must be able to beat the last to be timed. It only rises, so
    // a layout skipped is slower than every one of the final `keep`,
    // whatever the order the threads priced them in.
    std::vector<double> kept;
    const auto bar = [&] {
      return options.keep > 0 && static_cast<int>(kept.size()) == options.keep ? kept.back() : 0.0;
    };
    // Priced one pipeline's schedule at a time: the layouts sharing a
    // tensor, pipeline and context width and a micro-batch, schedule by
    // schedule. The enumeration's order alternates five schedules inside
    // each such run; at thousands of micro-batches five compiled schedules
    // passed the bound of what is remembered (schedule_timing.cpp), and
    // each was built again for every ZeRO stage, recomputation and
    // sequence parallelism. The slots keep the enumeration's order.
    std::vector<int> order(candidates.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const Layout& x = candidates[static_cast<size_t>(a)];
      const Layout& y = candidates[static_cast<size_t>(b)];
      return std::tie(x.tp, x.pp, x.cp, x.ep, x.micro_batch, x.schedule, x.virtual_stages) <
             std::tie(y.tp, y.pp, y.cp, y.ep, y.micro_batch, y.schedule, y.virtual_stages);
    });
    const auto start = std::chrono::steady_clock::now();
    auto last_report = start;
    std::exception_ptr error;
#pragma omp parallel for schedule(dynamic) num_threads(std::max(1, options.threads))
    for (int k = 0; k < total; ++k) {
      const int i = order[static_cast<size_t>(k)];
      try {
        // No timeline: each holds every action of every stage (hundreds of
        // kilobytes at thousands of micro-batches), and tens of thousands
        // kept took 24 GB. Whoever shows one prices its layout again.
        double beat = 0;
        {
          const std::lock_guard<std::mutex> lock(mutex);
          beat = bar();
        }
        Prediction p = predict_step(with_layout(deck, candidates[static_cast<size_t>(i)]), machine,
                                    static_cast<int>(node), true, false, beat);
        const std::lock_guard<std::mutex> lock(mutex);
        ++done;
        if (p.fits && p.timed && options.keep > 0 && p.tokens_per_s > bar()) {
          kept.insert(std::upper_bound(kept.begin(), kept.end(), p.tokens_per_s, std::greater<>()),
                      p.tokens_per_s);
          if (static_cast<int>(kept.size()) > options.keep) kept.pop_back();
        }
        if (p.fits && p.tokens_per_s > best.tokens_per_s) best = p;
        const auto now = std::chrono::steady_clock::now();
        if (options.progress && now - last_report >= options.report_every) {
          last_report = now;
          options.progress(done, total, std::chrono::duration<double>(now - start).count(),
                           best.fits ? &best : nullptr);
        }
        priced[static_cast<size_t>(i)] = std::move(p);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return priced;
  };
  std::vector<Prediction> priced = price(layouts);
  int total = static_cast<int>(layouts.size());
  // Nothing fits: the same layouts with the moments offloaded, where the
  // machine file prices it (a GPU's host memory; a disk, when the deck
  // names the directory the run would stream through).
  const auto fits = [](const Prediction& p) { return p.fits; };
  if (deck.train.offload == Offload::kNone && std::none_of(priced.begin(), priced.end(), fits)) {
    Offload where = Offload::kNone;
    // A GPU's offloaded update also crosses its link and runs on the host.
    const bool gpu_priced = machine.device != Device::kCuda ||
                            (machine.host_link_bandwidth > 0 && machine.host_adamw_bandwidth > 0);
    if (machine.device == Device::kCuda && gpu_priced) where = Offload::kHost;
    if (where == Offload::kNone && gpu_priced && !deck.train.offload_dir.empty() &&
        machine.disk_read_bandwidth > 0 && machine.disk_write_bandwidth > 0)
      where = Offload::kNvme;
    if (where != Offload::kNone) {
      for (Layout& l : layouts) l.offload = where;
      std::vector<Prediction> offloaded = price(layouts);
      total += static_cast<int>(offloaded.size());
      for (Prediction& p : offloaded) priced.push_back(std::move(p));
    }
  }
  plan.considered = total;
  plan.leanest = priced.front();
  for (Prediction& p : priced) {
    if (p.memory_max < plan.leanest.memory_max) plan.leanest = p;
    plan.fit += p.fits;
    plan.timed += p.fits && p.timed;
    if (p.fits && p.timed) plan.fitting.push_back(std::move(p));
  }
  std::stable_sort(plan.fitting.begin(), plan.fitting.end(),
                   [](const Prediction& a, const Prediction& b) {
                     if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
                     return a.memory_max < b.memory_max;
                   });
  // Past the first `keep`, which were timed depends on the threads' order.
  if (options.keep > 0 && static_cast<int>(plan.fitting.size()) > options.keep)
    plan.fitting.resize(static_cast<size_t>(options.keep));
  return plan;
}

Prediction choose_layout(const Deck& deck, int ranks, int ranks_per_node, int* fitting) {
  if (deck.run.machine.empty()) {
    throw InputError(deck.path, "[run] machine",
                     "[parallel] auto prices layouts with a machine file: write one with `mpirun "
                     "-np 2 mpiformer calibrate -o machine.toml` (or take one of inputs/machines/) "
                     "and name it here");
  }
  const MachineSpec machine = load_machine(deck.run.machine);
  // This node's cores, shared with its other ranks (each plans the same).
  PlanOptions options;
  options.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                    std::max(1, ranks_per_node));
  options.keep = 1;
  const Plan plan = plan_layouts(deck, machine, ranks, ranks_per_node, options);
  if (plan.fitting.empty()) throw InputError(deck.path, "[parallel] auto", plan_refusal(deck, machine, plan));
  *fitting = plan.fit;
  return plan.fitting.front();
}

std::string margin_note(const Deck& deck, const Prediction& p) {
  return strprintf("of which %.2f GiB are planned ([parallel] memory_margin = %g leaves the rest free)",
                   p.memory_planned / (1024.0 * 1024.0 * 1024.0), deck.parallel.memory_margin);
}

std::string plan_refusal(const Deck& deck, const MachineSpec& machine, const Plan& plan) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  return strprintf("no layout of %d ranks fits: the model needs at least %.1f GiB per rank (the "
                   "leanest layout, %s); %s gives %.2f GiB per rank, %s. Use more ranks, or a "
                   "machine with more memory",
                   plan.ranks, plan.leanest.memory_max / gib, plan.leanest.layout.describe().c_str(),
                   machine.name.c_str(), plan.leanest.memory_available / gib,
                   margin_note(deck, plan.leanest).c_str());
}

}  // namespace mpiformer
