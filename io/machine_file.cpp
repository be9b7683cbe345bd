#include "machine_file.hpp"

#include <cmath>
#include <set>
#include <sstream>
#include <toml.hpp>

#include "toml_file.hpp"

#include "deck.hpp"
#include "core/error.hpp"
#include "core/format.hpp"

namespace mpiformer {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The lower bound of a value that may be zero (latencies, runtime bytes).
constexpr double kZeroAllowed = -1;
// The least a rate or a time may be (exclusive): a GFLOP/s, a MB/s, a
// nanosecond, a MiB. Anything below is a typo or a unit slip, and would
// price a step at centuries (or, for a time, a kernel at infinite speed).
constexpr double kLeastTflops = 1e-3, kLeastGbs = 1e-3, kLeastMicros = 1e-3, kLeastGib = 1.0 / 1024;

// One table of the file, its keys checked against what it may hold.
class Section {
 public:
  Section(const toml::value& v, std::string path, std::string name, std::set<std::string> keys)
      : path_(std::move(path)), name_(std::move(name)) {
    if (!v.is_table()) throw InputError(path_, name_, "expected a table");
    table_ = &v.as_table();
    for (const auto& [k, _] : *table_) {
      if (!keys.count(k)) {
        std::string known;
        for (const auto& x : keys) known += (known.empty() ? "" : ", ") + x;
        throw InputError(path_, field(k), "unknown key (known here: " + known + ")");
      }
    }
  }
  std::string field(const std::string& k) const { return "[" + name_ + "] " + k; }
  bool has(const std::string& k) const { return table_->count(k) != 0; }
  const toml::value& at(const std::string& k) const { return table_->at(k); }
  // A number in (lo, hi] (or [0, hi] for `lo` = kZeroAllowed); `required`
  // or else `fallback`.
  double number(const std::string& k, double lo, double hi, bool required, double fallback) const {
    if (!has(k)) {
      if (required) throw InputError(path_, field(k), "missing (expected a number)");
      return fallback;
    }
    const toml::value& v = at(k);
    if (!v.is_integer() && !v.is_floating())
      throw InputError(path_, field(k), "expected a number");
    const double x = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
    const bool zero_ok = lo == kZeroAllowed;
    if (!((zero_ok ? x >= 0 : x > lo) && x <= hi)) {
      throw InputError(path_, field(k), strprintf("expected a value in %s%g, %g], got %g",
                                                  zero_ok ? "[" : "(", zero_ok ? 0.0 : lo, hi, x));
    }
    return x;
  }
  std::string text(const std::string& k, const std::string& fallback) const {
    if (!has(k)) return fallback;
    if (!at(k).is_string()) throw InputError(path_, field(k), "expected a string");
    return at(k).as_string().str;
  }

 private:
  std::string path_, name_;
  const toml::table* table_;
};

// model/stage_work.hpp's kernel_rate_name, and the optimizer's.
const std::set<std::string> kKernels = {"layernorm", "layernorm_backward", "gelu", "gelu_backward",
                                        "residual", "crossentropy", "embedding",
                                        "embedding_backward", "adamw"};

LinkCost read_cost(const Section& s, const LinkCost& fallback) {
  LinkCost c;
  c.latency = s.number("latency_us", kZeroAllowed, 1e9, false, fallback.latency * 1e6) * 1e-6;
  c.bandwidth = s.number("bandwidth_gbs", kLeastGbs, 1e9, fallback.bandwidth <= 0, fallback.bandwidth / 1e9) * 1e9;
  return c;
}

// [intra] / [inter]: a latency and bandwidth for every collective, and a
// sub-table per collective where it differs (calibrate measures each).
Link read_link(const toml::value& v, const std::string& path, const std::string& name) {
  const Section s(v, path, name,
                  {"latency_us", "bandwidth_gbs", "allreduce", "reduce_scatter", "allgather",
                   "sendrecv", "alltoall"});
  LinkCost base;
  base.latency = s.number("latency_us", kZeroAllowed, 1e9, true, 0) * 1e-6;
  base.bandwidth = s.number("bandwidth_gbs", kLeastGbs, 1e9, true, 0) * 1e9;
  Link l{base, base, base, base, base};
  const std::pair<const char*, LinkCost*> ops[] = {{"allreduce", &l.allreduce},
                                                   {"reduce_scatter", &l.reduce_scatter},
                                                   {"allgather", &l.allgather},
                                                   {"sendrecv", &l.sendrecv},
                                                   {"alltoall", &l.alltoall}};
  for (const auto& [op, cost] : ops) {
    if (!s.has(op)) continue;
    *cost = read_cost(Section(s.at(op), path, name + "." + op, {"latency_us", "bandwidth_gbs"}), base);
  }
  // Files from before calibrate measured it: the all-gather's rate, the
  // collective whose bytes and steps it shares.
  if (!s.has("alltoall")) l.alltoall = l.allgather;
  return l;
}

// What the libraries hold (runtime_mb) must leave the model some of the
// device: otherwise every layout would read as needing that much more
// than the device, which names the wrong cause.
void require_room(double runtime, double memory, const std::string& path, const std::string& key) {
  if (runtime >= memory) {
    throw InputError(path, key,
                     strprintf("%.6g MB is as much as a device's whole memory ([machine] "
                               "memory_gib = %.6g): nothing would be left for the model",
                               runtime / 1e6, memory / kGiB));
  }
}

}  // namespace

MachineSpec parse_machine(const std::string& text, const std::string& path) {
  const toml::value root = parse_toml_text(text, path);
  for (const auto& [k, _] : root.as_table()) {
    if (k != "machine" && k != "compute" && k != "intra" && k != "inter" && k != "offload")
      throw InputError(path, k,
                       "unknown section (expected [machine], [compute], [intra], [inter] or "
                       "[offload])");
  }
  MachineSpec m;
  m.path = path;
  if (!root.contains("machine")) throw InputError(path, "[machine]", "missing");
  const Section mach(root.at("machine"), path, "machine",
                     {"name", "device", "devices_per_node", "memory_gib", "peak_tflops", "runtime_mb"});
  m.name = mach.text("name", path);
  const std::string device = mach.text("device", "cpu");
  if (!parse_setting(kDeviceNames, device, &m.device) || m.device == Device::kAuto)
    throw InputError(path, "[machine] device", "expected \"cpu\" or \"cuda\", got \"" + device + "\"");
  m.devices_per_node = static_cast<int>(mach.number("devices_per_node", 0, 1 << 20, true, 0));
  if (m.devices_per_node != mach.number("devices_per_node", 0, 1 << 20, true, 0))
    throw InputError(path, "[machine] devices_per_node", "expected a whole number");
  m.memory = mach.number("memory_gib", kLeastGib, 1e9, true, 0) * kGiB;
  m.runtime = mach.number("runtime_mb", kZeroAllowed, 1e9, false, 0) * 1e6;
  require_room(m.runtime, m.memory, path, "[machine] runtime_mb");
  if (!root.contains("compute")) throw InputError(path, "[compute]", "missing");
  const Section comp(root.at("compute"), path, "compute",
                     {"precision", "matmul_tflops", "attention_tflops", "memory_gbs", "kernel_gbs",
                      "matmul", "attention", "kernels", "stage", "multiprocessors",
                      "matmul_tiles"});
  if (comp.has("precision")) {
    const std::string p = comp.text("precision", "");
    Precision x;
    if (!parse_setting(kPrecisionNames, p, &x))
      throw InputError(path, "[compute] precision",
                       "expected \"fp32\", \"bf16\" or \"fp16\", got \"" + p + "\"");
    m.precision = x;
  }
  m.matmul_flops = comp.number("matmul_tflops", kLeastTflops, 1e9, true, 0) * 1e12;
  m.attention_flops = comp.number("attention_tflops", kLeastTflops, 1e9, false, m.matmul_flops / 1e12) * 1e12;
  m.memory_bandwidth = comp.number("memory_gbs", kLeastGbs, 1e9, true, 0) * 1e9;
  m.peak_flops = mach.number("peak_tflops", kLeastTflops, 1e9, false, m.matmul_flops / 1e12) * 1e12;
  // No kernel outruns the device's peak: MFU would read above 100% and
  // every layout's time would be too short.
  for (const auto& [key, rate] : {std::pair<const char*, double>{"matmul_tflops", m.matmul_flops},
                                  {"attention_tflops", m.attention_flops}}) {
    if (rate > m.peak_flops) {
      throw InputError(path, std::string("[compute] ") + key,
                       strprintf("%g TFLOP/s, above [machine] peak_tflops %g: no kernel outruns the "
                                 "device's peak", rate / 1e12, m.peak_flops / 1e12));
    }
  }
  if (comp.has("kernel_gbs")) {
    const Section k(comp.at("kernel_gbs"), path, "compute.kernel_gbs", kKernels);
    for (const auto& name : kKernels)
      if (k.has(name)) m.kernel_bandwidth[name] = k.number(name, kLeastGbs, 1e9, true, 0) * 1e9;
  }
  auto rows = [&](const char* key) -> const toml::array* {
    if (!comp.has(key)) return nullptr;
    if (!comp.at(key).is_array())
      throw InputError(path, comp.field(key), "expected an array of tables ([[compute." + std::string(key) + "]])");
    return &comp.at(key).as_array();
  };
  if (const toml::array* a = rows("matmul")) {
    for (size_t i = 0; i < a->size(); ++i) {
      const Section r((*a)[i], path, strprintf("compute.matmul %zu", i + 1),
                      {"m", "k", "n", "forward_us", "backward_us"});
      MatmulPoint p;
      p.m = static_cast<int64_t>(r.number("m", 0, 1e12, true, 0));
      p.k = static_cast<int64_t>(r.number("k", 0, 1e12, true, 0));
      p.n = static_cast<int64_t>(r.number("n", 0, 1e12, true, 0));
      p.forward = r.number("forward_us", kLeastMicros, 1e15, true, 0) * 1e-6;
      p.backward = r.number("backward_us", kLeastMicros, 1e15, true, 0) * 1e-6;
      m.matmul.push_back(p);
    }
  }
  if (const toml::array* a = rows("matmul_tiles")) {
    for (size_t i = 0; i < a->size(); ++i) {
      const Section r((*a)[i], path, strprintf("compute.matmul_tiles %zu", i + 1), {"rows", "cols", "rate"});
      MatmulTile tile;
      for (auto [key, to] : {std::pair<const char*, int64_t*>{"rows", &tile.rows}, {"cols", &tile.cols}}) {
        const double v = r.number(key, 0, 1 << 16, true, 0);
        if (v != std::floor(v)) throw InputError(path, r.field(key), "expected a whole number");
        *to = static_cast<int64_t>(v);
      }
      // A tile's rate is a share of the large-GEMM rate, which no tile beats.
      tile.rate = r.number("rate", 0, 1, false, 1);
      m.matmul_tiles.push_back(tile);
    }
  }
  if (comp.has("multiprocessors")) {
    const double v = comp.number("multiprocessors", 0, 1 << 20, true, 0);
    if (v != std::floor(v)) throw InputError(path, comp.field("multiprocessors"), "expected a whole number");
    m.multiprocessors = static_cast<int>(v);
  }
  // The tiles mean nothing without the multiprocessors they fill, and back.
  if (m.matmul_tiles.empty() != (m.multiprocessors == 0)) {
    throw InputError(path, comp.field(m.matmul_tiles.empty() ? "matmul_tiles" : "multiprocessors"),
                     "missing: multiprocessors and matmul_tiles price a GEMM's shape together");
  }
  if (const toml::array* a = rows("kernels")) {
    std::set<std::string> keys = kKernels;
    keys.insert("elements");
    for (size_t i = 0; i < a->size(); ++i) {
      const Section r((*a)[i], path, strprintf("compute.kernels %zu", i + 1), keys);
      KernelRow row;
      row.elements = r.number("elements", 0, 1e15, true, 0);
      for (const auto& name : kKernels)
        if (r.has(name)) row.bandwidth[name] = r.number(name, kLeastGbs, 1e9, true, 0) * 1e9;
      m.kernels.push_back(row);
    }
  }
  if (const toml::array* a = rows("stage")) {
    for (size_t i = 0; i < a->size(); ++i) {
      const Section r((*a)[i], path, strprintf("compute.stage %zu", i + 1),
                      {"n_embd", "seq_len", "micro_batch", "layers", "recompute", "factor",
                       "runtime_mb"});
      StagePoint p;
      p.n_embd = static_cast<int64_t>(r.number("n_embd", 0, 1e9, true, 0));
      p.seq_len = static_cast<int64_t>(r.number("seq_len", 0, 1e9, true, 0));
      p.micro_batch = static_cast<int64_t>(r.number("micro_batch", 0, 1e9, true, 0));
      p.layers = static_cast<int64_t>(r.number("layers", 0, 1e9, true, 0));
      const std::string rc = r.text("recompute", "none");
      if (!parse_setting(kRecomputeNames, rc, &p.recompute))
        throw InputError(path, r.field("recompute"), "expected " + setting_choices(kRecomputeNames));
      p.factor = r.number("factor", 0, 100, true, 0);
      p.runtime = r.number("runtime_mb", kZeroAllowed, 1e9, false, m.runtime / 1e6) * 1e6;
      require_room(p.runtime, m.memory, path, r.field("runtime_mb"));
      m.stages.push_back(p);
    }
  }
  if (const toml::array* a = rows("attention")) {
    for (size_t i = 0; i < a->size(); ++i) {
      const Section r((*a)[i], path, strprintf("compute.attention %zu", i + 1),
                      {"head_size", "seq_len", "forward_us", "backward_us"});
      AttentionPoint p;
      p.head_size = static_cast<int64_t>(r.number("head_size", 0, 1e9, true, 0));
      p.seq_len = static_cast<int64_t>(r.number("seq_len", 0, 1e9, true, 0));
      p.forward = r.number("forward_us", kLeastMicros, 1e15, true, 0) * 1e-6;
      p.backward = r.number("backward_us", kLeastMicros, 1e15, true, 0) * 1e-6;
      m.attention.push_back(p);
    }
  }
  if (root.contains("offload")) {
    const Section off(root.at("offload"), path, "offload",
                      {"host_link_gbs", "host_adamw_gbs", "disk_read_gbs", "disk_write_gbs"});
    m.host_link_bandwidth = off.number("host_link_gbs", kLeastGbs, 1e9, false, 0) * 1e9;
    m.host_adamw_bandwidth = off.number("host_adamw_gbs", kLeastGbs, 1e9, false, 0) * 1e9;
    m.disk_read_bandwidth = off.number("disk_read_gbs", kLeastGbs, 1e9, false, 0) * 1e9;
    m.disk_write_bandwidth = off.number("disk_write_gbs", kLeastGbs, 1e9, false, 0) * 1e9;
  }
  if (!root.contains("intra")) throw InputError(path, "[intra]", "missing (the links within a node)");
  m.intra = read_link(root.at("intra"), path, "intra");
  m.has_inter = root.contains("inter");
  m.inter = m.has_inter ? read_link(root.at("inter"), path, "inter") : m.intra;
  return m;
}

MachineSpec load_machine(const std::string& path) {
  // The same guards as a deck's (a regular file, a few KB of TOML).
  return parse_machine(read_deck_text(path, "machine file"), path);
}

std::string MachineSpec::to_toml() const {
  std::string t = "[machine]\n";
  t += strprintf("name = \"%s\"\ndevice = \"%s\"\ndevices_per_node = %d\nmemory_gib = %.6g\n"
                 "peak_tflops = %.6g\nruntime_mb = %.6g\n\n",
                 name.c_str(), name_of(device), devices_per_node, memory / kGiB, peak_flops / 1e12,
                 runtime / 1e6);
  t += "[compute]\n";
  if (precision) t += strprintf("precision = \"%s\"\n", name_of(*precision));
  t += strprintf("matmul_tflops = %.6g\nattention_tflops = %.6g\nmemory_gbs = %.6g\n",
                 matmul_flops / 1e12, attention_flops / 1e12, memory_bandwidth / 1e9);
  if (!kernel_bandwidth.empty()) {
    t += "kernel_gbs = {";
    bool first = true;
    for (const auto& [k, bw] : kernel_bandwidth) {
      t += strprintf("%s%s = %.6g", first ? " " : ", ", k.c_str(), bw / 1e9);
      first = false;
    }
    t += " }\n";
  }
  if (multiprocessors > 0) {
    t += strprintf("multiprocessors = %d\nmatmul_tiles = [", multiprocessors);
    for (size_t i = 0; i < matmul_tiles.size(); ++i) {
      t += strprintf("%s{ rows = %lld, cols = %lld, rate = %.6g }", i ? ", " : " ",
                     static_cast<long long>(matmul_tiles[i].rows),
                     static_cast<long long>(matmul_tiles[i].cols), matmul_tiles[i].rate);
    }
    t += " ]\n";
  }
  for (const MatmulPoint& p : matmul) {
    t += strprintf("\n[[compute.matmul]]\nm = %lld\nk = %lld\nn = %lld\nforward_us = %.6g\n"
                   "backward_us = %.6g\n",
                   static_cast<long long>(p.m), static_cast<long long>(p.k),
                   static_cast<long long>(p.n), p.forward * 1e6, p.backward * 1e6);
  }
  for (const StagePoint& p : stages) {
    t += strprintf("\n[[compute.stage]]  # a real stage over the sum of its kernels\nn_embd = %lld\n"
                   "seq_len = %lld\nmicro_batch = %lld\nlayers = %lld\nrecompute = \"%s\"\n"
                   "factor = %.4g\nruntime_mb = %.4g\n",
                   static_cast<long long>(p.n_embd), static_cast<long long>(p.seq_len),
                   static_cast<long long>(p.micro_batch), static_cast<long long>(p.layers),
                   name_of(p.recompute), p.factor,
                   p.runtime / 1e6);
  }
  for (const KernelRow& r : kernels) {
    t += strprintf("\n[[compute.kernels]]  # GB/s over buffers of this many elements\nelements = %.0f\n",
                   r.elements);
    for (const auto& [k, bw] : r.bandwidth) t += strprintf("%s = %.6g\n", k.c_str(), bw / 1e9);
  }
  for (const AttentionPoint& p : attention) {
    t += strprintf("\n[[compute.attention]]\nhead_size = %lld\nseq_len = %lld\nforward_us = %.6g\n"
                   "backward_us = %.6g\n",
                   static_cast<long long>(p.head_size), static_cast<long long>(p.seq_len),
                   p.forward * 1e6, p.backward * 1e6);
  }
  auto link = [&](const char* name, const Link& l) {
    std::string s = strprintf("\n[%s]\nlatency_us = %.6g\nbandwidth_gbs = %.6g\n", name,
                              l.allreduce.latency * 1e6, l.allreduce.bandwidth / 1e9);
    const std::pair<const char*, const LinkCost*> ops[] = {{"reduce_scatter", &l.reduce_scatter},
                                                           {"allgather", &l.allgather},
                                                           {"sendrecv", &l.sendrecv},
                                                           {"alltoall", &l.alltoall}};
    for (const auto& [op, c] : ops)
      s += strprintf("%s = { latency_us = %.6g, bandwidth_gbs = %.6g }\n", op, c->latency * 1e6,
                     c->bandwidth / 1e9);
    return s;
  };
  if (host_link_bandwidth > 0 || host_adamw_bandwidth > 0 || disk_read_bandwidth > 0 ||
      disk_write_bandwidth > 0) {
    t += "\n[offload]  # [train] offload: GB/s to host memory (per device), the node's host AdamW "
         "and disk\n";
    if (host_link_bandwidth > 0) t += strprintf("host_link_gbs = %.6g\n", host_link_bandwidth / 1e9);
    if (host_adamw_bandwidth > 0) t += strprintf("host_adamw_gbs = %.6g\n", host_adamw_bandwidth / 1e9);
    if (disk_read_bandwidth > 0) t += strprintf("disk_read_gbs = %.6g\n", disk_read_bandwidth / 1e9);
    if (disk_write_bandwidth > 0) t += strprintf("disk_write_gbs = %.6g\n", disk_write_bandwidth / 1e9);
  }
  t += link("intra", intra);
  if (has_inter) t += link("inter", inter);
  return t;
}

}  // namespace mpiformer
