#include "plan/step_prediction.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <map>

#include "common/grad_compression.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/precision_plan.hpp"
#include "model/model_flops.hpp"
#include "model/shard_plan.hpp"
#include "plan/stage_tables.hpp"
#include "model/stage_layout.hpp"
#include "model/stage_options.hpp"
#include "model/stage_work.hpp"
#include "plan/gemm_tiles.hpp"
#include "plan/memory_report.hpp"

namespace mpiformer {

std::string Layout::describe() const {
  return strprintf("dp %lld pp %lld tp %lld mb %lld zero %lld %s %s", static_cast<long long>(dp),
                   static_cast<long long>(pp), static_cast<long long>(tp),
                   static_cast<long long>(micro_batch), static_cast<long long>(zero),
                   name_of(recompute), name_of(schedule)) +
         (virtual_stages > 1 ? strprintf(" v%lld", static_cast<long long>(virtual_stages)) : "") +
         (sequence_parallel ? " sp" : "") +
         (ep > 1 ? strprintf(" ep %lld", static_cast<long long>(ep)) : "") +
         (cp > 1 ? strprintf(" cp %lld", static_cast<long long>(cp)) : "") +
         (offload != Offload::kNone ? std::string(" offload ") + name_of(offload) : "");
}

Layout layout_of(const Deck& d) {
  return {d.parallel.dp,     d.parallel.pp,        d.parallel.tp,
          d.train.micro_batch, d.parallel.zero,      d.train.recompute,
          d.parallel.schedule, d.parallel.sequence_parallel, d.parallel.virtual_stages,
          d.train.offload,   d.parallel.ep,        d.parallel.cp};
}

Deck with_layout(const Deck& deck, const Layout& l) {
  Deck d = deck;
  d.parallel.dp = l.dp;
  d.parallel.pp = l.pp;
  d.parallel.tp = l.tp;
  d.parallel.zero = l.zero;
  d.parallel.schedule = l.schedule;
  d.parallel.sequence_parallel = l.sequence_parallel;
  d.parallel.virtual_stages = l.virtual_stages;
  d.train.micro_batch = l.micro_batch;
  d.train.recompute = l.recompute;
  d.train.offload = l.offload;
  d.parallel.ep = l.ep;
  d.parallel.cp = l.cp;
  return d;
}

namespace {

double log_distance(double a, double b) { return std::log(a / b); }

// Within 4x in every dimension a measured shape's rate stands for another's.
constexpr double kNear = 1.3862943611198906 * 1.7320508075688772;  // ln 4 x sqrt 3

double matmul_seconds(const MachineSpec& m, const WorkItem& w) {
  auto at = [&](const MatmulPoint& p) { return w.backward ? p.backward : p.forward; };
  auto flops = [&](const MatmulPoint& p) {
    return (w.backward ? 4.0 : 2.0) * static_cast<double>(p.m) * static_cast<double>(p.k) *
           static_cast<double>(p.n);
  };
  // Rows of the same width: seconds per FLOP linear in log m between the
  // nearest two (the rate changes with the row count, not its unit).
  const MatmulPoint *lo = nullptr, *hi = nullptr, *near = nullptr;
  double near_d = kNear;
  for (const MatmulPoint& p : m.matmul) {
    if (p.k == w.k && p.n == w.n) {
      if (p.m <= w.m && (!lo || p.m > lo->m)) lo = &p;
      if (p.m >= w.m && (!hi || p.m < hi->m)) hi = &p;
    }
    const double d = std::hypot(log_distance(p.m, w.m), log_distance(p.k, w.k), log_distance(p.n, w.n));
    if (d < near_d) near_d = d, near = &p;
  }
  if (lo && hi && lo != hi) {
    const double x = log_distance(w.m, lo->m) / log_distance(hi->m, lo->m);
    return w.flops * ((1 - x) * at(*lo) / flops(*lo) + x * at(*hi) / flops(*hi));
  }
  if (lo || hi) near = lo ? lo : hi;
  if (near) return w.flops * at(*near) / flops(*near);
  // No measured shape near (a hand-written file): the large-GEMM rate at
  // the share of it the output's tiles reach (plan/gemm_tiles.hpp), or the
  // memory's, whichever bounds this shape (a roofline: a thin product is
  // limited by its operands' bytes, not by the FLOPs). Backward is two
  // products of half its FLOPs each: dinp [m x k] and dW [k x n].
  const double compute =
      w.backward ? w.flops / 2 / m.matmul_flops *
                       (1 / tile_efficiency(m, w.m, w.k) + 1 / tile_efficiency(m, w.k, w.n))
                 : w.flops / (m.matmul_flops * tile_efficiency(m, w.m, w.n));
  return std::max(compute, m.memory_bandwidth > 0 ? w.bytes / m.memory_bandwidth : 0.0);
}

double attention_seconds(const MachineSpec& m, const WorkItem& w) {
  const AttentionPoint* near = nullptr;
  double near_d = kNear;
  for (const AttentionPoint& p : m.attention) {
    const double d = std::hypot(log_distance(p.head_size, w.k), log_distance(p.seq_len, w.n));
    if (d < near_d) near_d = d, near = &p;
  }
  // A GPU's fused kernel is causal: its measured rate is for the half of
  // each square below the diagonal, so a block seen whole costs twice it
  // (the host's kernel computes every square whole).
  const double whole = w.unmasked && m.device == Device::kCuda ? 2.0 : 1.0;
  if (!near) return whole * w.flops / m.attention_flops;
  // Per (batch, head), scaled by the products' size T^2 x head size.
  const double scale = static_cast<double>(w.n) * static_cast<double>(w.n) * static_cast<double>(w.k) /
                       (static_cast<double>(near->seq_len) * static_cast<double>(near->seq_len) *
                        static_cast<double>(near->head_size));
  return whole * static_cast<double>(w.m) * scale * (w.backward ? near->backward : near->forward);
}

// A kernel's bandwidth over `elements`: the measured rows, linear in log
// size between the nearest two (clamped at the ends), else the file's
// size-independent rate, else its memory bandwidth.
double bandwidth(const MachineSpec& m, const std::string& kernel, double elements) {
  const KernelRow *lo = nullptr, *hi = nullptr;
  for (const KernelRow& r : m.kernels) {
    if (!r.bandwidth.count(kernel)) continue;
    if (r.elements <= elements && (!lo || r.elements > lo->elements)) lo = &r;
    if (r.elements >= elements && (!hi || r.elements < hi->elements)) hi = &r;
  }
  if (lo && hi && lo != hi) {
    const double x = log_distance(elements, lo->elements) / log_distance(hi->elements, lo->elements);
    return (1 - x) * lo->bandwidth.at(kernel) + x * hi->bandwidth.at(kernel);
  }
  if (lo || hi) return (lo ? lo : hi)->bandwidth.at(kernel);
  const auto it = m.kernel_bandwidth.find(kernel);
  return it != m.kernel_bandwidth.end() ? it->second : m.memory_bandwidth;
}

}  // namespace

double item_seconds(const MachineSpec& m, const WorkItem& w) {
  if (w.kernel == Kernel::kMatmul) return matmul_seconds(m, w);
  if (w.kernel == Kernel::kAttention) return attention_seconds(m, w);
  return w.bytes / bandwidth(m, kernel_rate_name(w.kernel, w.backward), w.elements);
}

namespace {

// Linear in log key between the rows nearest below and above `key`
// (clamped at the ends); `rows` non-empty.
template <class Key, class Value>
double interpolate(const std::vector<const StagePoint*>& rows, double key, Key key_of, Value value_of) {
  const StagePoint *lo = nullptr, *hi = nullptr;
  for (const StagePoint* p : rows) {
    if (key_of(*p) <= key && (!lo || key_of(*p) > key_of(*lo))) lo = p;
    if (key_of(*p) >= key && (!hi || key_of(*p) < key_of(*hi))) hi = p;
  }
  if (lo && hi && key_of(*lo) != key_of(*hi)) {
    const double x = log_distance(key, key_of(*lo)) / log_distance(key_of(*hi), key_of(*lo));
    return (1 - x) * value_of(*lo) + x * value_of(*hi);
  }
  return value_of(lo ? *lo : *hi);
}

// What the measured stages say of one stage: its factor, looked up by the
// activations it keeps in flight (micro-batch x slots x its blocks, in
// sequence-blocks: the cache pressure a measured whole-model stage of one
// slot had at its micro-batch), and the runtime bytes, by micro-batch (the
// BLAS buffers follow the matmuls' size). Rows of the model's width and
// sequence and of the same recomputation where there are any (its
// backward runs the forward again on buffers just used), else recompute
// none's; else the nearest shape's within 4x; else factor 1 and the
// machine's runtime bytes.
struct StageFit {
  double factor = 1, runtime = 0;
};
StageFit stage_fit(const MachineSpec& m, const GptConfig& cfg, int64_t micro_batch,
                   Recompute recompute, double load) {
  bool measured = false;
  for (const StagePoint& p : m.stages) measured |= p.recompute == recompute;
  const Recompute want = measured ? recompute : Recompute::kNone;
  std::vector<const StagePoint*> same;
  const StagePoint* near = nullptr;
  double near_d = kNear;
  for (const StagePoint& p : m.stages) {
    if (p.recompute != want) continue;
    if (p.n_embd == cfg.n_embd && p.seq_len == cfg.seq_len) same.push_back(&p);
    const double d = std::hypot(log_distance(p.n_embd, cfg.n_embd), log_distance(p.seq_len, cfg.seq_len),
                                log_distance(p.micro_batch, micro_batch));
    if (d < near_d) near_d = d, near = &p;
  }
  if (same.empty() && near) same.push_back(near);
  if (same.empty()) return {1, m.runtime};
  const auto load_of = [](const StagePoint& p) { return static_cast<double>(p.micro_batch * p.layers); };
  const auto mb_of = [](const StagePoint& p) { return static_cast<double>(p.micro_batch); };
  return {interpolate(same, load, load_of, [](const StagePoint& p) { return p.factor; }),
          interpolate(same, static_cast<double>(micro_batch), mb_of,
                      [](const StagePoint& p) { return p.runtime; })};
}

// The ring algorithm over g ranks: `rounds` passes (2 for an all-reduce,
// 1 for a reduce-scatter or all-gather) of g - 1 steps, each rank sending
// (g - 1) / g of the buffer per pass.
double collective(const LinkCost& c, int64_t g, double bytes, double rounds) {
  if (g <= 1 || bytes <= 0) return 0;
  const double steps = rounds * static_cast<double>(g - 1);
  return steps * c.latency + rounds * bytes * static_cast<double>(g - 1) / static_cast<double>(g) / c.bandwidth;
}
double sendrecv(const LinkCost& c, double bytes) { return c.latency + bytes / c.bandwidth; }

// A chunk's pass as priced once in a prediction (predict_step's pass_of):
// the stages of a pipeline differ only in the embedding, the head and (a
// Mixture of Experts) which blocks are sparse, so most share one. Each
// item keeps its kernel seconds; a stage scales them by its own fit.
struct PricedItem {
  double seconds = 0;  // item_seconds
  double masked = 1;   // the share of attention's tiles a document mask keeps
  int list = 0;        // 0 forward, 1 backward, 2 weight gradients
  bool attention = false;
  size_t kernel = 0;   // its name's place in the prediction's kernel names
  int part = 0;        // its pass's: 0 the blocks, 1 before them, 2 after (StageWork's)
};
struct ChunkPass {
  // What identifies the pass: its blocks, the embedding and the head, and
  // in a Mixture of Experts its first layer (which blocks are sparse).
  int64_t layers = 0, first_layer = 0;
  bool embedding = false, head = false;
  std::vector<PricedItem> items;
  // Unscaled by the fit: the tensor collectives, the experts' all-to-alls
  // and the ring's sends (before what attention hides), the message.
  double tp_f = 0, tp_b = 0, tp_w = 0, ep_f = 0, ep_b = 0, ring_f = 0, ring_b = 0;
  double message_bytes = 0;
};

}  // namespace

std::pair<double, double> kernel_seconds(const MachineSpec& machine, const GptConfig& cfg,
                                         const StageRange& range, int64_t micro_batch,
                                         Recompute recompute, double act_bytes) {
  const StageWork work = stage_work(cfg, range, micro_batch, recompute, act_bytes);
  double f = 0, b = 0;
  for (const WorkItem& w : work.forward) f += item_seconds(machine, w);
  for (const WorkItem& w : work.backward) b += item_seconds(machine, w);
  return {f, b};
}

// Seconds to read and write `bytes` of offloaded state on the node's
// disk, which `ranks` ranks stream through at once (0 unless nvme).
double offload_seconds(const Deck& deck, const MachineSpec& machine, double bytes, int64_t ranks) {
  if (deck.train.offload != Offload::kNvme) return 0;
  return bytes * static_cast<double>(ranks) *
         (1 / machine.disk_read_bandwidth + 1 / machine.disk_write_bandwidth);
}
// Seconds a GPU's offloaded update moves `bytes` across its host link
// (gradients down, results up, one stream: the two directions one after
// the other); none on the host, where everything is in place.
double offload_link_seconds(const Deck& deck, const MachineSpec& machine, double bytes) {
  if (deck.train.offload == Offload::kNone || machine.device != Device::kCuda) return 0;
  return bytes / machine.host_link_bandwidth;
}

void require_rates_for(const Deck& deck, const MachineSpec& machine) {
  // Offload is priced with the [offload] section's rates.
  if (deck.train.offload == Offload::kNvme &&
      (machine.disk_read_bandwidth <= 0 || machine.disk_write_bandwidth <= 0)) {
    throw InputError(machine.path, "[offload] disk_read_gbs, disk_write_gbs",
                     "missing, and [train] offload = \"nvme\" streams the moments through the "
                     "disk: measure it with `mpiformer calibrate --offload-dir DIR` (the "
                     "directory the run will use) or write the disk's rates");
  }
  if (deck.train.offload != Offload::kNone && machine.device == Device::kCuda &&
      machine.host_link_bandwidth <= 0) {
    throw InputError(machine.path, "[offload] host_link_gbs",
                     "missing, and [train] offload moves the gradients and weights between the "
                     "GPU and host memory every step: write the link's rate per direction to "
                     "page-locked memory (PCIe 5 x16: about 50; NVLink-C2C: about 450)");
  }
  if (deck.train.offload != Offload::kNone && machine.device == Device::kCuda &&
      machine.host_adamw_bandwidth <= 0) {
    throw InputError(machine.path, "[offload] host_adamw_gbs",
                     "missing, and [train] offload runs AdamW on the host: measure the node's "
                     "rate with `mpiformer calibrate --offload-dir DIR` on it, or write it");
  }
  if (machine.precision && *machine.precision != deck.train.precision) {
    // Rates of another precision would price every kernel wrongly (bf16
    // GEMMs run about twice fp32's on this machine, 8-16x on a GPU).
    throw InputError(machine.path, "[compute] precision",
                     strprintf("its rates are %s's, but the deck trains in %s ([train] precision): "
                               "plan with a machine file of that precision (mpiformer calibrate "
                               "--precision %s)",
                               name_of(*machine.precision), name_of(deck.train.precision),
                               name_of(deck.train.precision)));
  }
}

double expert_imbalance(const Deck& deck) {
  if (deck.parallel.expert_imbalance > 0) return deck.parallel.expert_imbalance;
  return std::max(1.0, deck.model.capacity_factor);
}

Prediction predict_step(const Deck& deck, const MachineSpec& machine, int ranks_per_node,
                        bool time_if_fits, bool keep_timeline, double time_if_faster_than) {
  require_rates_for(deck, machine);
  Prediction out;
  out.layout = layout_of(deck);
  out.expert_imbalance = expert_imbalance(deck);
  const GptConfig& cfg = deck.model;
  // dp: the stage's replicas, whose reductions and shards span the
  // context ranks too (dp x cp).
  const int64_t cp = deck.parallel.cp, dp = deck.replicas(), pp = deck.parallel.pp,
                tp = deck.parallel.tp;
  const int64_t ranks = deck.ranks(), micro = deck.grad_accum();
  const int64_t R = ranks_per_node > 0 ? ranks_per_node : std::min<int64_t>(ranks, machine.devices_per_node);
  const double share = std::max(1.0, static_cast<double>(R) / machine.devices_per_node);
  const bool host = machine.device == Device::kCpu;
  const PrecisionPlan types = precision_plan(deck.train.precision);
  const double act = static_cast<double>(element_bytes(types.activations));
  const double acc = static_cast<double>(element_bytes(types.master));

  // Memory: the accounting the run refuses a deck with.
  BackendChoice choice;
  choice.device = machine.device;
  choice.precision = deck.train.precision;
  out.memory = predicted_memory(deck, choice);
  for (const RankMemory& r : out.memory) out.memory_max = std::max(out.memory_max, r.total());
  const StageFit fit = stage_fit(machine, cfg, deck.train.micro_batch, deck.train.recompute,
                                 static_cast<double>(deck.train.micro_batch * cfg.n_layer));
  out.runtime = fit.runtime;
  out.memory_max += fit.runtime;
  out.memory_available = machine.memory / share;
  out.memory_planned = out.memory_available * (1 - deck.parallel.memory_margin);
  out.fits = out.memory_max <= out.memory_planned;
  if (time_if_fits && !out.fits) return out;

  // Which links each group crosses (ranks fill nodes in grid order).
  // A group of consecutive ranks stays inside a node when it divides the
  // node's ranks (or the whole job fits in one); otherwise some of its
  // members talk across nodes, and the slowest link paces the ring.
  auto within = [&](int64_t span) { return ranks <= R || (span <= R && R % span == 0); };
  const Link& tp_link = within(tp) ? machine.intra : machine.inter;
  const Link& dp_link = within(tp * dp) ? machine.intra : machine.inter;
  const Link& cp_link = within(tp * cp) ? machine.intra : machine.inter;
  const Link& pp_link = ranks <= R ? machine.intra : machine.inter;
  // Host MPI progresses only while waited on: nothing hides.
  auto exposed = [&](double transfer, double window) {
    return host ? transfer : std::max(0.0, transfer - window);
  };

  // Interleaved: costs per virtual stage (chunk c of stage s at c pp + s).
  const int64_t v = deck.parallel.virtual_stages;
  ActionCosts costs;
  costs.forward.assign(static_cast<size_t>(pp * v), 0.0);
  costs.backward = costs.weights = costs.forward;
  std::vector<double> optimizer(pp, 0.0);
  size_t busiest = 0;  // the stage the step's split is reported for
  // Every tensor collective exposed, the backward sums started beside a
  // weight gradient too: how much NCCL's stream hides behind a GEMM it
  // shares the GPU with is not measured yet, and the planner errs slow.
  auto tp_seconds = [&](const TensorCollective& c) {
    if (c.kind == TensorCollective::kAllgather) return collective(tp_link.allgather, tp, c.bytes, 1);
    if (c.kind == TensorCollective::kReduceScatter)
      return collective(tp_link.reduce_scatter, tp, c.bytes, 1);
    return collective(tp_link.allreduce, tp, c.bytes, 2);
  };
  // An all-to-all within the data-parallel group's links: each rank
  // sends (ep - 1) / ep of its rows, at the links' measured all-to-all
  // rate (a machine file without one: the all-gather's).
  const int64_t ep = deck.parallel.ep;
  auto ep_seconds = [&](double bytes) { return collective(dp_link.alltoall, ep, bytes, 1); };
  // Each chunk's pass priced on its own (the embedding is chunk 0's, the
  // head the last's), once per kind of pass (ChunkPass).
  std::vector<std::string> kernel_names;
  std::deque<ChunkPass> passes;  // references to them stay valid as more come
  auto pass_of = [&](const StageRange& r) -> const ChunkPass& {
    const int64_t first = cfg.moe() ? r.first_layer : 0;
    for (const ChunkPass& p : passes)
      if (p.layers == r.num_layers() && p.first_layer == first &&
          p.embedding == r.has_embedding && p.head == r.has_head)
        return p;
    const StageWork work = stage_work(cfg, r, deck.train.micro_batch, deck.train.recompute, act,
                                      deck.parallel.sequence_parallel,
                                      splits_backward(deck.parallel.schedule), out.expert_imbalance, cp);
    ChunkPass p;
    p.layers = r.num_layers();
    p.first_layer = first;
    p.embedding = r.has_embedding;
    p.head = r.has_head;
    p.message_bytes = work.message_bytes;
    int list = 0;
    for (const auto* items : {&work.forward, &work.backward, &work.weights}) {
      for (size_t i = 0; i < items->size(); ++i) {
        const WorkItem& w = (*items)[i];
        PricedItem it;
        it.part = i < work.blocks_begin[list] ? 1 : i < work.blocks_end[list] ? 0 : 2;
        it.seconds = item_seconds(machine, w);
        // A GPU's attention computes only the tiles the document mask
        // keeps (the host's computes every causal one).
        it.masked = w.kernel == Kernel::kAttention && deck.data.document_mask &&
                            machine.device == Device::kCuda
                        ? deck.data.attention_kept
                        : 1.0;
        it.list = list;
        it.attention = w.kernel == Kernel::kAttention;
        const bool gemm = w.kernel == Kernel::kMatmul || w.kernel == Kernel::kAttention;
        const std::string name = gemm ? std::string(kernel_name(w.kernel)) + (w.backward ? "_backward" : "")
                                      : kernel_rate_name(w.kernel, w.backward);
        it.kernel = static_cast<size_t>(std::find(kernel_names.begin(), kernel_names.end(), name) -
                                        kernel_names.begin());
        if (it.kernel == kernel_names.size()) kernel_names.push_back(name);
        p.items.push_back(it);
      }
      ++list;
    }
    for (const TensorCollective& tc : work.tp_forward) p.tp_f += tp_seconds(tc);
    for (const TensorCollective& tc : work.tp_backward) p.tp_b += tp_seconds(tc);
    for (const TensorCollective& tc : work.tp_weights) p.tp_w += tp_seconds(tc);
    for (double bytes : work.ep_forward) p.ep_f += ep_seconds(bytes);
    for (double bytes : work.ep_backward) p.ep_b += ep_seconds(bytes);
    // The ring's sends, one block per ring step: beside the attention
    // of the pass on a GPU, exposed on the host (MPI moves them in the
    // waits). The same ring sends as much on every rank.
    const auto ring_seconds = [&](const StageWork::RingPass& rp) {
      return rp.blocks * sendrecv(cp_link.sendrecv, work.cp_block_bytes) +
             rp.sums * sendrecv(cp_link.sendrecv, work.cp_sums_bytes);
    };
    for (const auto& rp : work.cp_forward) p.ring_f += ring_seconds(rp);
    for (const auto& rp : work.cp_backward) p.ring_b += ring_seconds(rp);
    passes.push_back(std::move(p));
    return passes.back();
  };
  for (int64_t s = 0; s < pp; ++s) {
    const StageRange range = stage_range_of(deck, static_cast<int>(s), 0);
    const int slots = out.memory[static_cast<size_t>(s)].slots;  // its schedule's, counted once
    const double factor =
        stage_fit(machine, cfg, deck.train.micro_batch, deck.train.recompute,
                  static_cast<double>(deck.train.micro_batch * slots * range.full_chunk()))
            .factor;
    // The stage's sums of its chunks' passes.
    double fwd = 0, bwd = 0, wgt = 0, tp_time = 0, ep_time = 0, cp_time = 0;
    // How long the backward's other traffic holds the data-parallel
    // group's links (the same class of link: a rank's bandwidth on it is
    // shared), a micro-batch: the data-parallel transfers hide only in
    // the rest of the backward (below).
    double dp_link_busy = 0;
    std::vector<double> chunk_fwd(v), chunk_bwd(v), chunk_wgt(v);
    // Each chunk's pass seconds (forward, backward, W) before its blocks
    // and after them (the embedding's, the head's): where the stream's
    // transfers fall in the pass.
    std::vector<std::array<double, 3>> chunk_lead(v), chunk_tail(v);
    // The kernels' seconds a step by name (the report's split of the
    // busiest stage), summed item by item in order.
    std::vector<double> kernel_sums(kernel_names.size(), 0.0);
    std::vector<char> kernel_seen(kernel_names.size(), 0);
    double message_bytes = 0;
    for (int64_t c = 0; c < v; ++c) {
      const ChunkPass& pass = pass_of(chunk_range(range, c));
      message_bytes = pass.message_bytes;
      kernel_sums.resize(kernel_names.size(), 0.0);
      kernel_seen.resize(kernel_names.size(), 0);
      double f = 0, b = 0, w_time = 0, attend_f = 0, attend_b = 0;
      for (const PricedItem& it : pass.items) {
        const double t = it.seconds * share * factor * it.masked;
        (it.list == 0 ? f : it.list == 1 ? b : w_time) += t;
        if (it.part != 0) (it.part == 1 ? chunk_lead : chunk_tail)[c][it.list] += t;
        if (it.attention) (it.list == 0 ? attend_f : attend_b) += t;
        kernel_sums[it.kernel] += t * static_cast<double>(micro);
        kernel_seen[it.kernel] = 1;
      }
      const double tp_f = pass.tp_f, tp_b = pass.tp_b, tp_w = pass.tp_w;
      const double ep_f = pass.ep_f, ep_b = pass.ep_b;
      ep_time += ep_f + ep_b;
      double ring_f = pass.ring_f, ring_b = pass.ring_b;
      // The ring's whole transfer holds its links, hidden or not; the
      // tensor collectives theirs (exposed); the experts' all-to-alls go
      // over the data-parallel group's own.
      if (&cp_link == &dp_link) dp_link_busy += ring_b;
      if (&tp_link == &dp_link) dp_link_busy += tp_b + tp_w;
      dp_link_busy += ep_b;
      ring_f = exposed(ring_f, attend_f);
      ring_b = exposed(ring_b, attend_b);
      cp_time += ring_f + ring_b;
      chunk_fwd[c] = f + tp_f + ep_f + ring_f;
      chunk_bwd[c] = b + tp_b + ep_b + ring_b;
      chunk_wgt[c] = w_time + tp_w;
      fwd += chunk_fwd[c];
      bwd += chunk_bwd[c];
      wgt += chunk_wgt[c];
      tp_time += tp_f + tp_b + tp_w;
    }

    const std::shared_ptr<const StageTables> tables = stage_tables(cfg, range, dp, ep);
    const ParameterTable& table = tables->table;
    const StageLayout& layout = tables->layout;
    const double n = static_cast<double>(table.total_storage());
    const double block = static_cast<double>(layout.block_storage());
    const int64_t L = range.num_layers();
    const int zero = static_cast<int>(deck.parallel.zero);
    // [train] grad_dtype = bf16: the blocks' reduce-scatters carry Act
    // (zero_shards.hpp); the units outside the windows stay float.
    const bool grad16 = zero >= 1 && deck.train.grad_dtype == GradDtype::kBf16;
    // What is reduced once a step: the tensors outside the windows (from
    // zero 2, or zero 1 with 16-bit gradients, the vocabulary's gradients
    // may go through them, at zero 3 its weights too:
    // StageLayout::windows_vocab).
    const bool vocab = layout.windows_vocab(windows_vocab_grads(zero, grad16));
    const bool vocab_weights = layout.windows_vocab(windows_weights(zero));
    const double outside = static_cast<double>(layout.resident_offset(table.total_storage(), true, vocab));
    // The backward's time a data-parallel transfer can hide in: its
    // links' time that the tensor collectives, the expert all-to-alls and
    // the context ring leave free (before, the reduction hid behind the
    // whole backward, the ring's own sends on the same links included).
    const double dp_window = std::max(0.0, bwd + wgt - dp_link_busy);
    const double block_bwd = L > 0 ? dp_window / static_cast<double>(L) : 0;
    // Expert parallelism: the experts' gradients and shards go over the
    // dp / ep replicas holding them, the rest over dp (at ep 1 one group).
    double experts = 0;
    int64_t sparse_blocks = 0;
    if (ep > 1) {
      for (const auto& spec : table.specs())
        if (spec.expert >= 0) experts += static_cast<double>(spec.storage);
      // (Interleaved, the stage's layers are its chunks'.)
      for (int64_t i = 0; i < range.num_layers(); ++i) sparse_blocks += cfg.moe_layer(range.layer(i));
    }
    const double block_experts = sparse_blocks > 0 ? experts / static_cast<double>(sparse_blocks) : 0;
    // One pass over `elements` of the stage (of which `of_experts` experts').
    auto groups = [&](const LinkCost& link, double elements, double of_experts, double bytes,
                      double rounds) {
      return collective(link, dp, (elements - of_experts) * bytes, rounds) +
             collective(link, dp / ep, of_experts * bytes, rounds);
    };
    double reduce = 0, opt_comm = 0, per_micro_comm = 0, gathers_comm = 0;
    // Zero 2-3's vocabulary's reduce-scatters of one micro-batch, the
    // embedding's and the head's (their pieces').
    double vocab_rs[2] = {0, 0};
    const double blocks = n - outside;
    const double block_bytes = grad16 ? act : acc;
    // On a device the stage's data-parallel stream is played out with the
    // schedule (ActionCosts::block_transfers), its link the transfers' for
    // the share of the backward its other traffic leaves them (dp_window):
    //  - zero 0-1 reduce each block's gradients, summed over the
    //    micro-batches, once: issued as the last micro-batch's backward
    //    finishes the block (grad_reducer.hpp's buckets, zero_shards.hpp's
    //    reduce_resident_from), as are the tensors outside the blocks at
    //    every zero stage; the step waits for them;
    //  - zero 2-3 reduce-scatter each block's every micro-batch, running on
    //    beside the passes that follow until its gradient window is
    //    needed again;
    //  - zero 3's gathers queue on the same stream before the blocks that
    //    need them;
    //  - zero 1-3's gathers after AdamW run from the step's start, each
    //    forward waiting only for what it is about to use
    //    (zero_shards.hpp's publish).
    // On the host each is exposed (MPI moves it in the wait): zero 0-1's
    // reduction beyond one micro-batch's backward, a block's reduce-
    // scatter beyond its backward, its gathers beyond half of it, the
    // gathers after AdamW whole.
    const bool compressed = deck.train.grad_compression != GradCompression::kNone;
    const bool streamed = !host && dp_window > 0 && dp > 1 && !(zero == 0 && compressed);
    // One block's: reduce-scatter every micro-batch (zero 2-3), all-gather
    // before each use (zero 3), all-gather after AdamW (zero 1-2), and its
    // reduction once a step (zero 0: an all-reduce; zero 1: a reduce-
    // scatter).
    double block_rs = 0, block_ag = 0, publish = 0, final_reduce = 0;
    if (zero >= 1) {
      const double gather = groups(dp_link.allgather, block, block_experts, act, 1);
      const double scatter = groups(dp_link.reduce_scatter, block, block_experts, block_bytes, 1);
      if (zero >= 3) block_ag = gather; else publish = gather;
      if (zero >= 2) block_rs = scatter; else final_reduce = scatter;
    } else {
      final_reduce = groups(dp_link.allreduce, block, block_experts, acc, 2);
    }
    if (zero == 0 && compressed) {
      // train/compressed_allreduce.hpp: an all-to-all and an all-gather of
      // the compressed chunks (bf16 2 bytes an element; int8 1, and a float
      // per block), and its kernels' passes over the gradients (read the
      // gradients and residuals, write both back, the wire twice).
      const bool int8 = deck.train.grad_compression == GradCompression::kInt8;
      const double wire = int8 ? 1.0 + 4.0 / static_cast<double>(kQuantBlock) : 2.0;
      const double kernels = share * n * (16 + 2 * wire) / bandwidth(machine, "residual", n);
      reduce = exposed(groups(dp_link.alltoall, n, experts, wire, 1) +
                           groups(dp_link.allgather, n, experts, wire, 1) + kernels,
                       dp_window);
    } else if (zero == 0) {
      reduce = exposed(groups(dp_link.allreduce, n, experts, acc, 2), dp_window);
    } else {
      if (zero == 1 && grad16) {
        reduce = exposed(groups(dp_link.reduce_scatter, outside, 0, acc, 1) +
                             groups(dp_link.reduce_scatter, blocks, experts, act, 1),
                         dp_window);
      } else {
        const double rs_all = zero == 1 ? n : outside;
        reduce = exposed(groups(dp_link.reduce_scatter, rs_all, zero == 1 ? experts : 0, acc, 1),
                         zero == 1 ? dp_window : 0);
      }
      // After AdamW each rank's updated part of what the stage keeps whole
      // goes to the others: at zero 3 the tensors outside the windows only
      // (the blocks are gathered at each use, below).
      opt_comm = zero >= 3 ? groups(dp_link.allgather, outside, 0, act, 1)
                           : groups(dp_link.allgather, n, experts, act, 1);
      if (!streamed && zero >= 2)
        per_micro_comm += static_cast<double>(L) * exposed(block_rs, block_bwd);
      const auto pieces_of = [&](int64_t use) -> int64_t {
        return vocab && layout.vocab(use).begin >= 0 ? layout.vocab_pieces(use) : 0;
      };
      // A window still holding the block asked for is not gathered again
      // (zero 3): under 1F1B (and zb-h1, whose W reads no weights) a
      // forward follows a backward (and the reverse), so two of each pass's
      // blocks are already there, less those the vocabulary's pieces took
      // beside them (ShardStream::pass's evict: one piece takes the window
      // its neighbouring block does not, two or more both). Interleaved
      // chunk passes alternate chunks: none kept (counted).
      const int64_t kept = deck.parallel.schedule == ScheduleKind::kOneFOneB ||
                                   deck.parallel.schedule == ScheduleKind::kZbH1
                               ? 2
                               : 0;
      if (zero >= 3) {
        const auto kept_beside = [&](int64_t use) {
          return std::max<int64_t>(kept - std::min<int64_t>(pieces_of(use), 2), 0);
        };
        const int64_t kept_forward = kept_beside(StageLayout::kVocabIn);
        const int64_t kept_backward = kept_beside(StageLayout::kVocabOut);
        if (!streamed)
          gathers_comm = static_cast<double>(std::max<int64_t>(L - kept_forward, 0) +
                                             std::max<int64_t>(L - kept_backward, 0)) *
                         exposed(block_ag, block_bwd / 2);
      }
      // The vocabulary through the windows: each use's gradients reduce-
      // scattered after it (zero 2-3; zero 1's 16-bit sums once, at the
      // last micro-batch, a tied wte on a stage with both ends after the
      // embedding's only), its weights gathered before it (zero 3), piece
      // by piece (StageLayout::piece): a collective each, hidden as the
      // whole use's was. The head's pieces again before its
      // backward, but for the two its forward left in the windows where
      // the backward follows it. On a device the last micro-batch's
      // reduce-scatters go on the stream the step's reduction waits for
      // (the embedding's last of all: nothing follows to hide them), as
      // zero 1-2's of the tensors kept whole do: priced there, the other
      // micro-batches' here.
      const double hidden_micro =
          streamed ? static_cast<double>(micro - 1) / static_cast<double>(micro) : 1.0;
      for (const int64_t use : {StageLayout::kVocabIn, StageLayout::kVocabOut}) {
        const bool tied_here = layout.vocab_out.begin == layout.vocab_in.begin;
        if (zero == 1 && use == StageLayout::kVocabOut && tied_here) continue;
        const int64_t pieces = pieces_of(use);
        const double share = 1.0 / static_cast<double>(std::max<int64_t>(pieces, 1));
        for (int64_t k = 0; k < pieces; ++k) {
          const double size =
              static_cast<double>(layout.piece(StageLayout::piece_id(use, k)).size());
          const bool again = use == StageLayout::kVocabOut && (kept == 0 || k + 2 < pieces);
          if (vocab_weights)
            gathers_comm += (again ? 2 : 1) * exposed(groups(dp_link.allgather, size, 0, act, 1),
                                                      share * block_bwd / 2);
          const double rs = groups(dp_link.reduce_scatter, size, 0, block_bytes, 1);
          if (zero >= 2) per_micro_comm += hidden_micro * exposed(rs, share * block_bwd);
          vocab_rs[use == StageLayout::kVocabIn ? 0 : 1] += rs;
        }
      }
      per_micro_comm += gathers_comm;
    }
    if (streamed) {
      if (costs.block_transfers.empty()) {
        costs.block_transfers.assign(static_cast<size_t>(pp * v), {});
        costs.published.assign(static_cast<size_t>(pp), {});
        costs.reduced.assign(static_cast<size_t>(pp), {});
      }
      const double stretch = (bwd + wgt) / dp_window;
      for (int64_t c = 0; c < v; ++c) {
        ActionCosts::BlockTransfers& b = costs.block_transfers[static_cast<size_t>(c * pp + s)];
        b = {range.chunk_block(c), range.chunk_layers(c), block_rs * stretch, block_ag * stretch,
             publish * stretch, final_reduce * stretch, chunk_lead[c], chunk_tail[c]};
        if (zero >= 3 && vocab) {
          if (c == 0 && range.has_embedding)
            b.embedding_pieces = layout.vocab_pieces(StageLayout::kVocabIn);
          if (c == v - 1 && range.has_head)
            b.head_pieces = layout.vocab_pieces(StageLayout::kVocabOut);
        }
      }
      // The tensors outside the blocks (those the windows do not carry):
      // gathered by the use that waits for them, reduced by where they lie
      // (before or after the blocks: when the backward has finished them).
      double used_first = 0, used_last = 0, before = 0, after = 0;
      for (const auto& spec : table.specs()) {
        if (spec.layer >= 0) continue;
        const auto size = static_cast<double>(spec.storage);
        if (!vocab_weights || !layout.is_vocab(spec.offset))
          (layout.use_of(spec.offset) == StageLayout::kVocabOut ? used_last : used_first) += size;
        if (!vocab || !layout.is_vocab(spec.offset))
          (spec.offset >= layout.block_end ? after : before) += size;
      }
      const auto outside_reduce = [&](double elements) {
        return zero == 0 ? groups(dp_link.allreduce, elements, 0, acc, 2)
                         : groups(dp_link.reduce_scatter, elements, 0, acc, 1);
      };
      if (zero >= 1)
        costs.published[static_cast<size_t>(s)] = {
            groups(dp_link.allgather, used_first, 0, act, 1) * stretch,
            groups(dp_link.allgather, used_last, 0, act, 1) * stretch};
      costs.reduced[static_cast<size_t>(s)] = {(outside_reduce(before) + vocab_rs[0]) * stretch,
                                               (outside_reduce(after) + vocab_rs[1]) * stretch};
      reduce = 0;    // in the stream's waits
      opt_comm = 0;
    }
    // The passes over each block's gradient window after its backward, on
    // the compute stream, every micro-batch (zero_shards.hpp): at zero 2-3
    // the reduced part added into the shard's float gradients (the part
    // read, the shard read and written: (4 + 8) / dp bytes a parameter,
    // (2 + 8) / dp from 16 bits), with 16-bit gradients after the window
    // rounded for the wire (4 read, 2 written); at zero 1 with 16-bit
    // gradients the window added into the blocks' 16-bit sums (4 + 2 read,
    // 2 written).
    double window_passes = 0;
    if (zero >= 2 || grad16) {
      const double bytes = zero == 1 ? acc + 2 * act
                                     : (grad16 ? acc + act : 0) +
                                           ((grad16 ? act : acc) + 2 * acc) / static_cast<double>(dp);
      window_passes = share * blocks * bytes / bandwidth(machine, "residual", block);
    }
    bwd += window_passes;
    const double window_seconds = window_passes > 0 ? window_passes * static_cast<double>(micro) : 0;
    // The tied embedding's gradient, summed across the first and last stage.
    if (const ParameterSpec* tied = table.tied_embedding(); pp > 1 && tied != nullptr) {
      const double wte = static_cast<double>(tied->storage);
      reduce += collective(pp_link.allreduce, 2, (zero == 0 ? wte : wte / dp) * acc, 2);
    }
    // The gradients of kv heads shared by tensor ranks, summed over those
    // ranks (what each owns of them, after the data-parallel reduction).
    if (const int64_t share = cfg.kv_share(tp); share > 1) {
      double rows = 0;
      for (const auto& spec : table.specs()) {
        const ParameterSpec::Rows r = spec.shared_rows();
        rows += static_cast<double>((r.end - r.begin) * spec.row_length());
      }
      reduce += collective(tp_link.allreduce, share, (zero == 0 ? rows : rows / dp) * acc, 2);
    }
    // The per-micro-batch transfers where they fall: half of zero 3's
    // gathers precede forwards; the rest, and the reduce-scatters, backwards.
    // Interleaved, each chunk's pass carries its share of them.
    const double fwd_comm = gathers_comm / 2;
    for (int64_t c = 0; c < v; ++c) {
      const size_t at = static_cast<size_t>(c * pp + s);
      costs.forward[at] = chunk_fwd[c] + fwd_comm / static_cast<double>(v);
      costs.backward[at] =
          chunk_bwd[c] + (per_micro_comm - fwd_comm + window_passes) / static_cast<double>(v);
      costs.weights[at] = chunk_wgt[c];
    }
    costs.reduce.push_back(reduce);
    // AdamW on what this rank owns, the gradient norm, zeroing the
    // gradients, and ZeRO's gather of the updated weights.
    const double owned = zero >= 1 ? out.memory[static_cast<size_t>(s)].shard : n;  // its ShardPlan's
    const double grads = zero >= 2 ? outside + 2 * block : n;
    const double zeroing = share * (owned + grads) * acc / bandwidth(machine, "residual", grads);
    double math = share * owned * 7 * acc / bandwidth(machine, "adamw", owned) + zeroing;
    // The gradient norm's all-reduce over every rank (a few bytes).
    const double norm = collective(ranks <= R ? machine.intra.allreduce : machine.inter.allreduce, ranks, 8, 2);
    // [train] offload (train/adamw_state.hpp): AdamW runs on the host over
    // the state streamed in blocks. The disk (nvme: the moments, and the
    // masters in mixed precision, read and written once, the node's ranks
    // at once) and a GPU's link (gradients down; the 16-bit copy up, or in
    // fp32 the masters down and up) each overlap the host's update, whose
    // memory the node's ranks share too: the slowest of the three paces it.
    // Under "host" at zero 0 with data parallelism the gradients come down
    // bucket by bucket during backward, on a stream of their own: priced
    // as hidden behind backward (the link is otherwise idle then), so the
    // step's link carries only what goes up (fp32: the masters both ways).
    // So at zero 2-3 on a GPU, where the shard's gradients live in host
    // memory and each block's sums come down as backward makes them
    // (train/zero_shards.hpp): once per micro-batch, also priced hidden.
    double update = math;
    if (deck.train.offload != Offload::kNone) {
      const bool held = masters_offloaded(deck.train.offload, types.weight_copy);
      const bool grads_early = (deck.train.offload == Offload::kHost && zero == 0 && dp > 1) ||
                               (zero >= 2 && machine.device == Device::kCuda && types.master == Element::kF32);
      const double stream = offload_seconds(deck, machine, (held ? 3 : 2) * owned * acc, R);
      const double link = offload_link_seconds(
          deck, machine, owned * ((grads_early ? 0 : acc) + (held ? act : 2 * acc)));
      if (!host) {
        math = owned * 7 * acc * static_cast<double>(R) / machine.host_adamw_bandwidth + zeroing;
      }
      update = std::max({math, stream, link});
    }
    optimizer[s] = update + opt_comm + norm;
    // The step's split is reported for the busiest stage (the one that
    // paces the pipeline); the rest of its time is the bubble.
    const double busy = (fwd + bwd + wgt) * static_cast<double>(micro);
    if (busy >= out.compute) {
      busiest = static_cast<size_t>(s);
      out.compute = busy;
      out.tp_comm = tp_time * static_cast<double>(micro);
      out.ep_comm = ep_time * static_cast<double>(micro);
      out.cp_comm = cp_time * static_cast<double>(micro);
      out.exposed_comm = reduce + per_micro_comm * static_cast<double>(micro) + opt_comm + norm;
      out.optimizer = update;
      std::map<std::string, double> by_kernel;
      for (size_t k = 0; k < kernel_sums.size(); ++k)
        if (kernel_seen[k]) by_kernel[kernel_names[k]] = kernel_sums[k];
      if (window_passes > 0) by_kernel["gradient_windows"] += window_seconds;
      out.kernels.assign(by_kernel.begin(), by_kernel.end());
    }
    costs.p2p = pp > 1 ? sendrecv(pp_link.sendrecv, message_bytes) : 0;
  }
  costs.optimizer = *std::max_element(optimizer.begin(), optimizer.end());
  const double tokens = static_cast<double>(deck.train.global_batch * cfg.seq_len);
  if (time_if_faster_than > 0 &&
      tokens / step_time_floor(deck.parallel.schedule, static_cast<int>(pp), static_cast<int>(micro),
                               costs, static_cast<int>(v)) <
          time_if_faster_than)
    return out;  // cannot be: not timed
  out.timed = true;
  out.step = simulate_step(deck.parallel.schedule, static_cast<int>(pp), static_cast<int>(micro),
                           costs, static_cast<int>(v), keep_timeline);
  // The reductions the stream did not hide, where the simulation found
  // them (a pass stalled on a window, the step's reduction on the stream).
  if (!out.step.reduction_waits.empty()) out.exposed_comm += out.step.reduction_waits[busiest];
  out.bubble = std::max(0.0, out.step.step_time - out.compute - out.exposed_comm - out.optimizer);
  out.tokens_per_s = tokens / out.step.step_time;
  const StageRange whole{0, cfg.n_layer, true, true};
  out.mfu = training_flops_per_token(cfg, stage_tables(cfg, whole, 1, 1)->table) * out.tokens_per_s /
            (static_cast<double>(ranks) * machine.peak_flops);
  return out;
}

}  // namespace mpiformer
