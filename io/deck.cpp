#include "deck.hpp"

#include "weight_source.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <toml.hpp>

#include "data_sources.hpp"
#include "toml_file.hpp"

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/layer_chunks.hpp"

namespace mpiformer {
namespace {

enum class Kind { Int, Float, String, Bool, WordOrNumber };

// One key of the schema: where it lives in Deck, its bounds and default.
struct Key {
  const char* section;
  const char* name;
  Kind kind;
  bool required;
  double min;  // inclusive bounds for numbers
  double max;
  std::function<void(Deck&, const toml::value&)> set;
  std::function<std::string(const Deck&)> show;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

template <class M>
Key int_key(const char* sec, const char* name, bool req, double lo, double hi, M member) {
  return {sec, name, Kind::Int, req, lo, hi,
          [member](Deck& d, const toml::value& v) { member(d) = v.as_integer(); },
          [member](const Deck& d) { return std::to_string(member(const_cast<Deck&>(d))); }};
}
template <class M>
Key float_key(const char* sec, const char* name, bool req, double lo, double hi, M member) {
  return {sec, name, Kind::Float, req, lo, hi,
          [member](Deck& d, const toml::value& v) {
            member(d) = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
          },
          [member](const Deck& d) { return shortest_decimal(member(const_cast<Deck&>(d))); }};
}
template <class M>
Key string_key(const char* sec, const char* name, bool req, M member) {
  return {sec, name, Kind::String, req, 0, 0,
          [member](Deck& d, const toml::value& v) { member(d) = v.as_string().str; },
          [member](const Deck& d) {
            std::ostringstream os;
            os << toml::value(member(const_cast<Deck&>(d)));
            return os.str();
          }};
}

// A string naming one of an enum's values (core/settings.hpp).
template <class E, size_t N, class M>
Key choice_key(const char* sec, const char* name, const SettingName<E> (&names)[N], M member) {
  return {sec, name, Kind::String, false, 0, 0,
          [member, &names, sec, name](Deck& d, const toml::value& v) {
            const std::string text = v.as_string().str;
            if (!parse_setting(names, text, &member(d))) {
              throw InputError("", strprintf("[%s] %s", sec, name),
                               "expected " + setting_choices(names) + ", got \"" + text + "\"");
            }
          },
          [member, &names](const Deck& d) {
            return "\"" + std::string(setting_name(names, member(const_cast<Deck&>(d)))) + "\"";
          }};
}

// [checkpoint] resume: "auto", "never" or a path.
Key resume_key() {
  return {"checkpoint", "resume", Kind::String, false, 0, 0,
          [](Deck& d, const toml::value& v) {
            const std::string text = v.as_string().str;
            CheckpointConfig& c = d.checkpoint;
            c.resume_path.clear();
            if (text == "auto") {
              c.resume = ResumeMode::kAuto;
            } else if (text == "never") {
              c.resume = ResumeMode::kNever;
            } else if (text.empty()) {
              throw InputError("", "[checkpoint] resume",
                               "expected \"auto\", \"never\" or a checkpoint path");
            } else {
              c.resume = ResumeMode::kPath;
              c.resume_path = text;
            }
          },
          [](const Deck& d) {
            const CheckpointConfig& c = d.checkpoint;
            std::ostringstream os;
            os << toml::value(c.resume == ResumeMode::kAuto    ? std::string("auto")
                              : c.resume == ResumeMode::kNever ? std::string("never")
                                                               : c.resume_path);
            return os.str();
          }};
}

// [train] loss_scale: "dynamic" (stored as 0) or a positive number.
Key loss_scale_key() {
  return {"train", "loss_scale", Kind::WordOrNumber, false, 0, 0,
          [](Deck& d, const toml::value& v) {
            if (v.is_string()) {
              if (v.as_string().str != "dynamic") {
                throw InputError("", "[train] loss_scale",
                                 "expected \"dynamic\" or a number > 0, got \"" +
                                     v.as_string().str + "\"");
              }
              d.train.loss_scale = 0;
              return;
            }
            const double x = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
            // Outside [2^-8, 2^24] fp16's scaled gradients of a sane model
            // are all below its smallest number (nothing trains) or above
            // its largest (every step overflows).
            if (!(x >= kMinFixedLossScale && x <= kMaxLossScale)) {
              throw InputError("", "[train] loss_scale",
                               strprintf("expected \"dynamic\" or a fixed scale in [2^-8, 2^24] "
                                         "(below, fp16's gradients underflow to zero; above, they "
                                         "overflow), got %s",
                                         toml::format(v).c_str()));
            }
            d.train.loss_scale = x;
          },
          [](const Deck& d) {
            return d.train.loss_scale == 0 ? std::string("\"dynamic\"") : shortest_decimal(d.train.loss_scale);
          }};
}

template <class M>
Key bool_key(const char* sec, const char* name, M member) {
  return {sec, name, Kind::Bool, false, 0, 0,
          [member](Deck& d, const toml::value& v) { member(d) = v.as_boolean(); },
          [member](const Deck& d) { return std::string(member(const_cast<Deck&>(d)) ? "true" : "false"); }};
}

#define MEMBER(expr) [](Deck& d) -> auto& { return d.expr; }

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = {
      int_key("model", "n_layer", true, 1, 1024, MEMBER(model.n_layer)),
      int_key("model", "n_head", true, 1, 1024, MEMBER(model.n_head)),
      int_key("model", "n_embd", true, 1, 65536, MEMBER(model.n_embd)),
      int_key("model", "seq_len", true, 1, 1 << 20, MEMBER(model.seq_len)),
      int_key("model", "vocab_size", false, 1, 1 << 24, MEMBER(model.vocab_size)),
      choice_key("model", "family", kFamilyNames, MEMBER(model.family)),
      int_key("model", "n_kv_head", false, 1, 1024, MEMBER(model.n_kv_head)),
      int_key("model", "ffn_hidden", false, 1, 1 << 20, MEMBER(model.ffn_hidden)),
      int_key("model", "ffn_multiple_of", false, 1, 1 << 16, MEMBER(ffn_multiple_of)),
      float_key("model", "rope_theta", false, 1, 1e12, MEMBER(model.rope_theta)),
      float_key("model", "norm_eps", false, 1e-12, 1, MEMBER(model.norm_eps)),
      bool_key("model", "tie_embeddings", MEMBER(model.tie_embeddings)),
      int_key("model", "experts", false, 0, 1024, MEMBER(model.experts)),
      int_key("model", "top_k", false, 1, 1024, MEMBER(model.top_k)),
      int_key("model", "moe_every", false, 1, 1024, MEMBER(model.moe_every)),
      float_key("model", "capacity_factor", false, 0, 1024, MEMBER(model.capacity_factor)),
      float_key("model", "aux_loss", false, 0, 1e6, MEMBER(model.aux_loss)),
      float_key("model", "router_z_loss", false, 0, 1e6, MEMBER(model.router_z_loss)),
      string_key("model", "init", false, MEMBER(model_init)),
      string_key("data", "train", false, MEMBER(data.train)),
      string_key("data", "val", false, MEMBER(data.val)),
      int_key("data", "vocab_size", false, 1, 1 << 24, MEMBER(data.vocab_size)),
      string_key("data", "tokenizer", false, MEMBER(data.tokenizer)),
      bool_key("data", "reblend", MEMBER(data.reblend)),
      int_key("data", "warn_repeats", false, 1, 1e9, MEMBER(data.warn_repeats)),
      bool_key("data", "document_mask", MEMBER(data.document_mask)),
      int_key("train", "steps", true, 1, 1e12, MEMBER(train.steps)),
      int_key("train", "global_batch", true, 1, 1e9, MEMBER(train.global_batch)),
      int_key("train", "micro_batch", true, 1, 1e6, MEMBER(train.micro_batch)),
      float_key("train", "lr", true, 0, 10, MEMBER(train.lr)),
      float_key("train", "min_lr", false, 0, 10, MEMBER(train.min_lr)),
      int_key("train", "warmup_steps", false, 0, 1e12, MEMBER(train.warmup_steps)),
      float_key("train", "weight_decay", false, 0, 10, MEMBER(train.weight_decay)),
      float_key("train", "grad_clip", false, 0, kInf, MEMBER(train.grad_clip)),
      float_key("train", "beta1", false, 0, 0.999999, MEMBER(train.beta1)),
      float_key("train", "beta2", false, 0, 0.999999999, MEMBER(train.beta2)),
      float_key("train", "eps", false, 1e-30, 1, MEMBER(train.eps)),
      int_key("train", "seed", false, 0, 9.007199254740992e15, MEMBER(train.seed)),
      int_key("train", "log_every", false, 1, 1e12, MEMBER(train.log_every)),
      int_key("train", "eval_every", false, 0, 1e12, MEMBER(train.eval_every)),
      int_key("train", "eval_batches", false, 1, 1e9, MEMBER(train.eval_batches)),
      int_key("train", "stop_at", false, 1, 1e12, MEMBER(train.stop_at)),
      choice_key("train", "precision", kPrecisionNames, MEMBER(train.precision)),
      loss_scale_key(),
      int_key("train", "loss_scale_window", false, 1, 1e12, MEMBER(train.loss_scale_window)),
      float_key("train", "min_loss_scale", false, kMinFixedLossScale, 0x1p16, MEMBER(train.min_loss_scale)),
      choice_key("train", "nonfinite", kNonfiniteNames, MEMBER(train.nonfinite)),
      float_key("train", "spike_zscore", false, 0, 1e6, MEMBER(train.spike_zscore)),
      int_key("train", "skip_limit", false, 1, 1e9, MEMBER(train.skip_limit)),
      choice_key("train", "recompute", kRecomputeNames, MEMBER(train.recompute)),
      choice_key("train", "offload", kOffloadNames, MEMBER(train.offload)),
      string_key("train", "offload_dir", false, MEMBER(train.offload_dir)),
      float_key("train", "offload_block_mb", false, 0.004, 65536, MEMBER(train.offload_block_mb)),
      choice_key("train", "grad_compression", kGradCompressionNames, MEMBER(train.grad_compression)),
      choice_key("train", "grad_dtype", kGradDtypeNames, MEMBER(train.grad_dtype)),
      int_key("parallel", "dp", false, 1, 1 << 20, MEMBER(parallel.dp)),
      int_key("parallel", "pp", false, 1, 1 << 20, MEMBER(parallel.pp)),
      int_key("parallel", "tp", false, 1, 1 << 20, MEMBER(parallel.tp)),
      int_key("parallel", "ep", false, 1, 1 << 20, MEMBER(parallel.ep)),
      int_key("parallel", "cp", false, 1, 1 << 20, MEMBER(parallel.cp)),
      choice_key("parallel", "cp_chunks", kContextChunksNames, MEMBER(parallel.cp_chunks)),
      choice_key("parallel", "schedule", kScheduleNames, MEMBER(parallel.schedule)),
      int_key("parallel", "virtual_stages", false, 1, 1024, MEMBER(parallel.virtual_stages)),
      float_key("parallel", "bucket_mb", false, 0.001, 1e6, MEMBER(parallel.bucket_mb)),
      int_key("parallel", "zero", false, 0, 3, MEMBER(parallel.zero)),
      bool_key("parallel", "sequence_parallel", MEMBER(parallel.sequence_parallel)),
      bool_key("parallel", "auto", MEMBER(parallel.auto_layout)),
      float_key("parallel", "memory_margin", false, 0, 0.9, MEMBER(parallel.memory_margin)),
      float_key("parallel", "expert_imbalance", false, 0, 1024, MEMBER(parallel.expert_imbalance)),
      string_key("run", "dir", false, MEMBER(run.dir)),
      choice_key("run", "device", kDeviceNames, MEMBER(run.device)),
      float_key("run", "peak_tflops", false, 0, 1e9, MEMBER(run.peak_tflops)),
      int_key("run", "blas_threads", false, 0, 4096, MEMBER(run.blas_threads)),
      bool_key("run", "trace", MEMBER(run.trace)),
      float_key("run", "time_limit", false, 1e-3, 1e9, MEMBER(run.time_limit)),
      float_key("run", "watchdog_s", false, 0, 1e9, MEMBER(run.watchdog_s)),
      string_key("run", "machine", false, MEMBER(run.machine)),
      choice_key("run", "health_check", kHealthCheckNames, MEMBER(run.health_check)),
      float_key("run", "health_fraction", false, 0, 1, MEMBER(run.health_fraction)),
      choice_key("run", "health_action", kHealthActionNames, MEMBER(run.health_action)),
      int_key("run", "straggler_every", false, 0, 1e9, MEMBER(run.straggler_every)),
      string_key("checkpoint", "dir", false, MEMBER(checkpoint.dir)),
      int_key("checkpoint", "every", false, 0, 1e12, MEMBER(checkpoint.every)),
      int_key("checkpoint", "keep", false, 0, 1e6, MEMBER(checkpoint.keep)),
      bool_key("checkpoint", "at_end", MEMBER(checkpoint.at_end)),
      bool_key("checkpoint", "async", MEMBER(checkpoint.async)),
      choice_key("checkpoint", "read_back", kReadBackNames, MEMBER(checkpoint.read_back)),
      float_key("checkpoint", "mtbf_hours", false, 0, 1e7, MEMBER(checkpoint.mtbf_hours)),
      resume_key(),
  };
  return keys;
}
#undef MEMBER

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int: return "an integer";
    case Kind::Float: return "a number";
    case Kind::String: return "a string";
    case Kind::Bool: return "true or false";
    case Kind::WordOrNumber: return "a string or a number";
  }
  return "";
}

std::string toml_type_name(const toml::value& v) {
  std::ostringstream os;
  os << v.type();
  return os.str();
}

std::string field(const Key& k) { return strprintf("[%s] %s", k.section, k.name); }

// Type- and range-checks one value and stores it.
void apply(Deck& d, const Key& k, const toml::value& v, const std::string& where) {
  const bool ok = (k.kind == Kind::Int && v.is_integer()) ||
                  (k.kind == Kind::Float && (v.is_integer() || v.is_floating())) ||
                  (k.kind == Kind::String && v.is_string()) ||
                  (k.kind == Kind::Bool && v.is_boolean()) ||
                  (k.kind == Kind::WordOrNumber && (v.is_string() || v.is_integer() || v.is_floating()));
  if (!ok) {
    throw InputError(where, field(k),
                     strprintf("expected %s, got %s", kind_name(k.kind), toml_type_name(v).c_str()));
  }
  if (k.kind == Kind::Int || k.kind == Kind::Float) {
    const double x = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
    if (!(x >= k.min && x <= k.max) || std::isnan(x)) {
      throw InputError(where, field(k),
                       strprintf("expected a value in [%g, %g], got %s", k.min, k.max,
                                 toml::format(v).c_str()));
    }
  }
  try {
    k.set(d, v);
  } catch (const InputError& e) {
    // A value the key's own parser refused (an enum's spelling): name where.
    if (!e.file().empty()) throw;
    throw InputError(where, e.field(), e.reason());
  }
}

const Key* find_key(const std::string& section, const std::string& name) {
  for (const auto& k : schema())
    if (section == k.section && name == k.name) return &k;
  return nullptr;
}

std::string known_keys(const std::string& section) {
  std::string s;
  for (const auto& k : schema())
    if (section == k.section) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

bool known_section(const std::string& section) { return !known_keys(section).empty(); }

// Interleaving's constraints: chunks as core/layer_chunks.hpp cuts them
// (every chunk the same number of layers where they divide, Megatron's
// rule; else the first and last chunks shorter, Meta's), and micro-batches
// in whole rounds of pp, which its order walks chunk by chunk
// (parallel/pipeline_schedule.hpp).
void check_virtual_stages(const Deck& d, const std::string& where) {
  const auto& par = d.parallel;
  const long long v = par.virtual_stages, pp = par.pp, layers = d.model.n_layer;
  if (par.schedule != ScheduleKind::kInterleaved) {
    if (v != 1) {
      throw InputError(where, "[parallel] virtual_stages",
                       strprintf("%lld chunks per rank need schedule \"interleaved\" (schedule "
                                 "is \"%s\"); leave virtual_stages at 1",
                                 v, name_of(par.schedule)));
    }
    return;
  }
  if (v < 2) {
    throw InputError(where, "[parallel] schedule, [parallel] virtual_stages",
                     strprintf("schedule \"interleaved\" needs virtual_stages >= 2 model chunks "
                               "per rank, got %lld (with 1 it is \"1f1b\")", v));
  }
  if (pp < 2) {
    throw InputError(where, "[parallel] schedule, [parallel] pp",
                     "schedule \"interleaved\" needs pp >= 2 (it interleaves the chunks of a "
                     "pipeline), got pp 1");
  }
  const LayerChunks cut = layer_chunks(layers, pp, v);
  if (!cut.refusal.empty()) {
    throw InputError(where, "[parallel] virtual_stages, [parallel] pp, [model] n_layer",
                     strprintf("schedule \"interleaved\" cuts the %lld layers into pp x "
                               "virtual_stages = %lld x %lld = %lld chunks, each as long as the "
                               "longest but the first and last, which give up the excess: %s; "
                               "use fewer chunks per rank or fewer stages",
                               layers, pp, v, pp * v, cut.refusal.c_str()));
  }
  const long long m = d.grad_accum();
  if (m % pp != 0) {
    throw InputError(where, "[parallel] schedule, [train] global_batch, [parallel] pp",
                     strprintf("schedule \"interleaved\" runs micro-batches in rounds of pp = "
                               "%lld: global_batch / (dp x micro_batch) = %lld micro-batches per "
                               "step must be a multiple of pp", pp, m));
  }
}

// The Llama family's shapes: grouped-query heads that divide the query
// heads and split over the tensor group, rotary pairs, an MLP that splits.
void check_llama_relations(const Deck& d, const std::string& where) {
  const GptConfig& m = d.model;
  const long long nh = m.n_head, nkv = m.kv_heads(), tp = d.parallel.tp;
  if (nh % nkv != 0) {
    throw InputError(where, "[model] n_kv_head",
                     strprintf("must divide [model] n_head (%lld): each kv head serves an equal "
                               "group of query heads, got %lld", nh, nkv));
  }
  if (m.head_dim() % 2 != 0) {
    throw InputError(where, "[model] n_embd, [model] n_head",
                     strprintf("head size n_embd / n_head = %lld must be even (rotary positions "
                               "rotate channel pairs)", static_cast<long long>(m.head_dim())));
  }
  if (!m.kv_heads_split(tp)) {
    throw InputError(where, "[parallel] tp, [model] n_kv_head",
                     strprintf("one of tp %lld and n_kv_head %lld must divide the other (each tensor "
                               "rank keeps whole kv heads, or one kv head shared by tp / n_kv_head "
                               "ranks)", tp, nkv));
  }
  if (m.ffn() % tp != 0) {
    throw InputError(where, "[parallel] tp, [model] ffn_hidden",
                     strprintf("tp %lld must divide ffn_hidden %lld (each tensor rank keeps an "
                               "equal share of the MLP)", tp, static_cast<long long>(m.ffn())));
  }
}

// A Mixture of Experts: the router's keys mean nothing in a dense model
// (refused there away from their defaults, as Llama's are in GPT-2), and
// each token chooses top_k different experts.
void check_moe_relations(const Deck& d, const std::string& where) {
  const GptConfig& m = d.model;
  const GptConfig dense;
  const int64_t ep = d.parallel.ep;
  if (!m.moe() && d.parallel.expert_imbalance != 0) {
    throw InputError(where, "[parallel] expert_imbalance, [model] experts",
                     "prices a Mixture of Experts' busiest expert-parallel rank; this model is "
                     "dense ([model] experts = 0)");
  }
  if (d.parallel.expert_imbalance != 0 && d.parallel.expert_imbalance < 1) {
    throw InputError(where, "[parallel] expert_imbalance",
                     strprintf("the busiest rank's rows over the fair share: at least 1 (or 0, "
                               "automatic), got %g", d.parallel.expert_imbalance));
  }
  if (!m.moe() && ep > 1) {
    throw InputError(where, "[parallel] ep, [model] experts",
                     strprintf("ep %lld divides a Mixture of Experts' experts over ranks; this "
                               "model is dense ([model] experts = 0)",
                               static_cast<long long>(ep)));
  }
  if (!m.moe()) {
    const std::pair<const char*, bool> moe_only[] = {
        {"top_k", m.top_k != dense.top_k},
        {"moe_every", m.moe_every != dense.moe_every},
        {"capacity_factor", m.capacity_factor != dense.capacity_factor},
        {"aux_loss", m.aux_loss != dense.aux_loss},
        {"router_z_loss", m.router_z_loss != dense.router_z_loss}};
    for (const auto& [key, changed] : moe_only)
      if (changed)
        throw InputError(where, std::string("[model] ") + key + ", [model] experts",
                         "applies to a Mixture of Experts only: set [model] experts > 0 (0, the "
                         "default, is a dense model)");
    return;
  }
  check_expert_count(m, where, "[model] experts, [model] n_layer, [model] moe_every");
  if (m.top_k > m.experts) {
    throw InputError(where, "[model] top_k, [model] experts",
                     strprintf("each token picks top_k = %lld different experts of the %lld: "
                               "top_k must not exceed experts",
                               static_cast<long long>(m.top_k), static_cast<long long>(m.experts)));
  }
  // Under [parallel] auto the planner chooses ep with dp.
  if (ep == 1 || d.parallel.auto_layout) return;
  // A stage's replicas are its dp x cp ranks (context ranks hold the
  // same parameters): ep groups of them share the experts out.
  const int64_t replicas = d.parallel.dp * d.parallel.cp;
  if (m.experts % ep != 0 || replicas % ep != 0) {
    throw InputError(where, "[parallel] ep, [parallel] dp, [model] experts",
                     strprintf("ep %lld must divide both dp x cp (%lld: each group of ep replicas "
                               "shares the experts out) and experts (%lld: each rank holds as many)",
                               static_cast<long long>(ep), static_cast<long long>(replicas),
                               static_cast<long long>(m.experts)));
  }
}

// One training set: [data] train, or a blend of [[data.source]].
void check_data_relations(const Deck& d, const std::string& where) {
  const DataConfig& data = d.data;
  if (data.train.empty() && data.sources.empty()) {
    throw InputError(where, "[data] train",
                     "missing: name a token dataset (a file or a glob), or a blend of "
                     "[[data.source]] tables");
  }
  if (!data.train.empty() && !data.sources.empty()) {
    throw InputError(where, "[data] train, [[data.source]]",
                     "give one: [data] train is a single source, [[data.source]] a blend (a "
                     "blend of one is a [[data.source]] with any weight)");
  }
}

// Context parallelism: two chunks of every sequence per rank.
void check_context_relations(const Deck& d, const std::string& where) {
  const long long cp = d.parallel.cp;
  // Under [parallel] auto the planner chooses cp (where these rules allow).
  if (cp == 1 || d.parallel.auto_layout) return;
  if (d.model.seq_len % (2 * cp) != 0) {
    throw InputError(where, "[parallel] cp",
                     strprintf("needs [model] seq_len (%lld) to be a multiple of 2 cp = %lld: "
                               "each of the cp ranks holds two equal chunks of every sequence, "
                               "one from the front and one from the back",
                               static_cast<long long>(d.model.seq_len), 2 * cp));
  }
  if (d.parallel.sequence_parallel && (d.model.seq_len / cp) % d.parallel.tp != 0) {
    throw InputError(where, "[parallel] sequence_parallel, [parallel] cp",
                     strprintf("needs the tokens of each sequence a context rank holds "
                               "(seq_len / cp = %lld) to be a multiple of [parallel] tp (%lld)",
                               static_cast<long long>(d.model.seq_len / cp),
                               static_cast<long long>(d.parallel.tp)));
  }
}

void check_relations(const Deck& d, const std::string& where) {
  check_data_relations(d, where);
  check_moe_relations(d, where);
  check_context_relations(d, where);
  if (d.model.n_embd % d.model.n_head != 0) {
    throw InputError(where, "[model] n_embd",
                     strprintf("must be a multiple of [model] n_head (%lld), got %lld",
                               static_cast<long long>(d.model.n_head),
                               static_cast<long long>(d.model.n_embd)));
  }
  if (d.model.llama()) check_llama_relations(d, where);
  if (d.train.min_lr > d.train.lr) {
    throw InputError(where, "[train] min_lr",
                     strprintf("must not exceed [train] lr (%g), got %g", d.train.lr,
                               d.train.min_lr));
  }
  const int64_t per_step = d.parallel.dp * d.train.micro_batch;
  if (d.train.global_batch % per_step != 0) {
    throw InputError(
        where, "[train] global_batch",
        strprintf("must be a multiple of [parallel] dp x [train] micro_batch = %lld x %lld = "
                  "%lld (so every step is whole micro-batches), got %lld",
                  static_cast<long long>(d.parallel.dp), static_cast<long long>(d.train.micro_batch),
                  static_cast<long long>(per_step), static_cast<long long>(d.train.global_batch)));
  }
  // Megatron's partitioning: each tensor rank keeps whole heads. With
  // n_head dividing n_embd this also gives every rank an equal share of the
  // attention's n_embd and the MLP's 4 x n_embd channels.
  if (d.model.n_head % d.parallel.tp != 0) {
    throw InputError(where, "[parallel] tp",
                     strprintf("must divide [model] n_head (%lld) so each tensor rank keeps whole "
                               "attention heads, got %lld",
                               static_cast<long long>(d.model.n_head),
                               static_cast<long long>(d.parallel.tp)));
  }
  // Under [parallel] auto the planner chooses tp and sequence parallelism.
  if (d.parallel.sequence_parallel && !d.parallel.auto_layout && d.parallel.tp < 2) {
    throw InputError(where, "[parallel] sequence_parallel",
                     strprintf("needs [parallel] tp > 1 (it divides the tensor group's rows "
                               "among its ranks), got tp %lld",
                               static_cast<long long>(d.parallel.tp)));
  }
  if (d.parallel.sequence_parallel && d.model.seq_len % d.parallel.tp != 0) {
    throw InputError(where, "[parallel] sequence_parallel",
                     strprintf("needs [model] seq_len (%lld) to be a multiple of [parallel] tp "
                               "(%lld), so every tensor rank holds as many rows",
                               static_cast<long long>(d.model.seq_len),
                               static_cast<long long>(d.parallel.tp)));
  }
  // W reads the activations the forward kept; full recomputation keeps
  // only each block's input (and under auto the planner picks both).
  if (splits_backward(d.parallel.schedule) && d.train.recompute == Recompute::kFull &&
      !d.parallel.auto_layout) {
    throw InputError(where, "[parallel] schedule, [train] recompute",
                     strprintf("schedule \"%s\" defers each micro-batch's weight gradients, "
                               "which read the activations its forward kept; recompute \"full\" "
                               "keeps none. Use recompute \"attention\" or \"none\", or "
                               "schedule \"1f1b\"",
                               name_of(d.parallel.schedule)));
  }
  if (d.parallel.pp > d.model.n_layer) {
    throw InputError(where, "[parallel] pp",
                     strprintf("must not exceed [model] n_layer (%lld), got %lld",
                               static_cast<long long>(d.model.n_layer),
                               static_cast<long long>(d.parallel.pp)));
  }
  if (!d.parallel.auto_layout) check_virtual_stages(d, where);
  if (d.train.grad_compression != GradCompression::kNone && d.train.precision == Precision::kFp16) {
    throw InputError(where, "[train] grad_compression",
                     "not with [train] precision = \"fp16\": its loss scale changes the units of "
                     "what error feedback keeps from step to step; use bf16 or fp32");
  }
  if (d.train.grad_compression != GradCompression::kNone && d.parallel.zero != 0) {
    throw InputError(where, "[train] grad_compression",
                     strprintf("\"%s\" compresses zero 0's all-reduce; [parallel] zero is %lld "
                               "(its reduce-scatters go uncompressed): use zero = 0 or "
                               "grad_compression = \"none\"",
                               name_of(d.train.grad_compression),
                               static_cast<long long>(d.parallel.zero)));
  }
  if (d.train.grad_dtype == GradDtype::kBf16 && d.train.precision != Precision::kBf16) {
    throw InputError(where, "[train] grad_dtype",
                     strprintf("\"bf16\" needs [train] precision = \"bf16\" (got \"%s\"): the "
                               "16-bit gradients are the bf16 stage's activation type; use "
                               "grad_dtype = \"fp32\"",
                               name_of(d.train.precision)));
  }
  if (d.train.grad_dtype == GradDtype::kBf16 && d.parallel.zero == 0) {
    throw InputError(where, "[train] grad_dtype",
                     "\"bf16\" is built on ZeRO's shards (the update reads each rank's reduced "
                     "part in float): set [parallel] zero = 1, which at dp 1 is zero 0's "
                     "arithmetic and, at any dp, its gradients' and moments' memory or less; or "
                     "use grad_dtype = \"fp32\"");
  }
  if (d.checkpoint.async && d.train.offload != Offload::kNone) {
    throw InputError(where, "[checkpoint] async",
                     strprintf("not with [train] offload = \"%s\": the save's snapshot would hold "
                               "in memory the optimizer state that offload keeps out of it; use "
                               "async = false",
                               name_of(d.train.offload)));
  }
  if (d.train.offload == Offload::kNvme && d.train.offload_dir.empty()) {
    throw InputError(where, "[train] offload_dir",
                     "needed with [train] offload = \"nvme\": a node-local directory that exists "
                     "(e.g. the job's scratch), where each rank keeps its optimizer state");
  }
}

}  // namespace

std::string read_deck_text(const std::string& path, const char* what) {
  const char* article = std::string("aeiou").find(what[0]) != std::string::npos ? "an" : "a";
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    throw InputError(path, "", strprintf("cannot open the %s (does the file exist?)", what));
  }
  // A FIFO or a device would block or never end; a deck is a small file.
  if (!std::filesystem::is_regular_file(status)) {
    throw InputError(path, "", strprintf("not a regular file (%s %s is a TOML file)", article, what));
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxDeckBytes) {
    throw InputError(path, "",
                     strprintf("%llu bytes: %s %s is a few hundred bytes of TOML, at most %lld "
                               "(is this the right file?)",
                               static_cast<unsigned long long>(size), article, what,
                               static_cast<long long>(kMaxDeckBytes)));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", strprintf("cannot open the %s (permissions?)", what));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > kMaxDeckBytes) {
    throw InputError(path, "", strprintf("larger than %s %s can be", article, what));
  }
  return text;
}

Deck load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_deck(read_deck_text(path), path, overrides);
}

// Llama's sizes the deck left out: every kv head its own (multi-head), the
// MLP 8/3 n_embd rounded up.
static void resolve_llama_defaults(Deck& d) {
  GptConfig& m = d.model;
  if (m.n_kv_head == 0) m.n_kv_head = m.n_head;
  if (m.ffn_hidden == 0 && m.n_embd > 0) m.ffn_hidden = llama_ffn_hidden(m.n_embd, d.ffn_multiple_of);
}

// The family's keys: Llama's away from their defaults in a GPT-2 deck are
// refused (GPT-2 has none of them); a Llama deck's defaults are resolved
// into the values themselves (the resolved deck, and checkpoints, carry
// them).
static void resolve_family(Deck& d, const std::string& path, std::map<std::string, bool>& seen) {
  const Deck defaults;
  GptConfig& m = d.model;
  if (!m.llama()) {
    const std::pair<const char*, bool> llama_only[] = {
        {"n_kv_head", m.n_kv_head != 0},
        {"ffn_hidden", m.ffn_hidden != 0},
        {"ffn_multiple_of", d.ffn_multiple_of != defaults.ffn_multiple_of},
        {"rope_theta", m.rope_theta != defaults.model.rope_theta},
        {"norm_eps", m.norm_eps != defaults.model.norm_eps},
        {"tie_embeddings", !m.tie_embeddings}};
    for (const auto& [key, changed] : llama_only) {
      if (changed) {
        throw InputError(path, std::string("[model] ") + key,
                         "applies to [model] family = \"llama\" only (GPT-2 has full multi-head "
                         "attention, a 4 x n_embd GELU MLP, LayerNorm and a tied head)");
      }
    }
    return;
  }
  if (!seen["model.tie_embeddings"]) m.tie_embeddings = false;  // Llama's default: its own head
  // With init the file gives what the deck leaves out (resolve_model_init).
  if (d.model_init.empty()) resolve_llama_defaults(d);
}

Deck parse_deck(const std::string& text, const std::string& path,
                const std::vector<std::string>& overrides) {
  const toml::value root = parse_toml_text(text, path);
  Deck d;
  d.path = path;
  std::map<std::string, bool> seen;
  for (const auto& [section, table] : root.as_table()) {
    if (!table.is_table() || !known_section(section)) {
      throw InputError(path, section,
                       "unknown section (expected [model], [data], [train], [parallel], [run] or [checkpoint])");
    }
    for (const auto& [name, value] : table.as_table()) {
      if (section == "data" && name == "source") {
        d.data.sources = parse_data_sources(value, path);
        continue;
      }
      const Key* k = find_key(section, name);
      if (k == nullptr) {
        throw InputError(path, "[" + section + "] " + name,
                         "unknown key (known in [" + section + "]: " + known_keys(section) + ")");
      }
      apply(d, *k, value, path);
      seen[section + "." + name] = true;
      if (section == "model") d.model_keys.insert(name);
    }
  }
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    const auto dot = o.find('.');
    const std::string where = "--set " + o;
    if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
      throw InputError(where, "", "expected section.key=value");
    }
    const std::string section = o.substr(0, dot), name = o.substr(dot + 1, eq - dot - 1);
    const std::string text = o.substr(eq + 1);
    const Key* k = find_key(section, name);
    if (k == nullptr) throw InputError(where, "[" + section + "] " + name, "unknown key");
    toml::value v;
    try {
      std::istringstream in("v = " + text);
      v = toml::parse(in, "--set").at("v");
    } catch (const std::exception&) {
      v = toml::value(text);  // a bare word: a string such as a path
    }
    if (k->kind == Kind::String && !v.is_string()) v = toml::value(text);
    apply(d, *k, v, where);
    seen[section + "." + name] = true;
    if (section == "model") d.model_keys.insert(name);
  }
  for (const auto& k : schema()) {
    // With init the model's shape may come from the weights file.
    const bool from_init = !d.model_init.empty() && std::string(k.section) == "model";
    if (k.required && !from_init && !seen[std::string(k.section) + "." + k.name]) {
      throw InputError(path, field(k), std::string("missing (expected ") + kind_name(k.kind) + ")");
    }
  }
  // Loss scaling keys away from their defaults in a run that does not scale
  // (the resolved deck of any run lists them at their defaults).
  const Deck defaults;
  const std::pair<const char*, bool> scaling[] = {
      {"loss_scale", d.train.loss_scale != defaults.train.loss_scale},
      {"loss_scale_window", d.train.loss_scale_window != defaults.train.loss_scale_window},
      {"min_loss_scale", d.train.min_loss_scale != defaults.train.min_loss_scale}};
  for (const auto& [key, changed] : scaling) {
    if (changed && d.train.precision != Precision::kFp16) {
      throw InputError(path, std::string("[train] ") + key,
                       strprintf("applies to [train] precision = \"fp16\" only (this deck's is "
                                 "\"%s\", which needs no loss scaling)",
                                 name_of(d.train.precision)));
    }
  }
  resolve_family(d, path, seen);
  if (d.train.min_lr < 0) d.train.min_lr = d.train.lr / 10;
  if (d.checkpoint.dir.empty()) d.checkpoint.dir = d.run.dir + "/checkpoints";
  if (d.model_init.empty()) check_relations(d, path);
  return d;
}

void check_model_limits(const GptConfig& cfg, const std::string& file,
                        const std::string& field_prefix) {
  Deck d;
  d.model = cfg;
  for (const auto& k : schema()) {
    if (std::string(k.section) != "model" || k.kind != Kind::Int) continue;
    const double v = std::stod(k.show(d));
    if (v != 0 && !(v >= k.min && v <= k.max)) {
      throw InputError(file, field_prefix + k.name,
                       strprintf("%.0f, outside [%.0f, %.0f] (the limits of [model] %s)", v, k.min,
                                 k.max, k.name));
    }
  }
  check_expert_count(cfg, file, field_prefix + "experts, " + field_prefix + "n_layer");
}

void check_imported_model(const GptConfig& cfg, const std::string& file,
                          const std::vector<std::pair<std::string, std::string>>& fields) {
  Deck d;
  d.model = cfg;
  for (const auto& [key, field] : fields) {
    for (const auto& k : schema()) {
      if (std::string(k.section) != "model" || k.name != key) continue;
      if (k.kind != Kind::Int && k.kind != Kind::Float) break;
      const std::string shown = k.show(d);
      const double v = shown == "nan" || shown == "-nan" ? std::nan("") : std::stod(shown);
      if (!(v >= k.min && v <= k.max)) {
        throw InputError(file, field,
                         strprintf("%s, outside [%g, %g] (the limits of [model] %s)", shown.c_str(),
                                   k.min, k.max, k.name));
      }
    }
  }
  check_expert_count(cfg, file, fields.empty() ? "experts" : "num_local_experts");
}

void check_expert_count(const GptConfig& cfg, const std::string& file, const std::string& field) {
  // Each expert's tensors are rows of the parameter table: the product,
  // not each factor, sizes it (DeepSeek-V3 has 256 x 58 = 14 848).
  constexpr int64_t kMostExperts = int64_t{1} << 16;
  if (cfg.experts > 0 && cfg.moe_every > 0 && cfg.experts * cfg.moe_layers() > kMostExperts) {
    throw InputError(file, field,
                     strprintf("%lld experts in each of %lld sparse layers make %lld expert MLPs; "
                               "at most %lld",
                               static_cast<long long>(cfg.experts),
                               static_cast<long long>(cfg.moe_layers()),
                               static_cast<long long>(cfg.experts * cfg.moe_layers()),
                               static_cast<long long>(kMostExperts)));
  }
}

void resolve_model_init(Deck& d) {
  if (d.model_init.empty()) return;
  // A deck that gives the whole shape needs no file to be resolved: a run
  // that resumes (and so ignores init) still starts after its pretrained
  // file is gone; a fresh run reads it and reports it missing then.
  const GptConfig& m = d.model;
  std::error_code ec;
  if (m.n_layer > 0 && m.n_head > 0 && m.n_embd > 0 && m.seq_len > 0 && m.vocab_size > 0 &&
      !std::filesystem::exists(d.model_init, ec)) {
    if (m.llama()) resolve_llama_defaults(d);
    check_relations(d, d.path);
    return;
  }
  const WeightsShape w = read_weights_shape(d.model_init);
  if (w.cfg.llama() != d.model.llama()) {
    throw InputError(d.path, "[model] family",
                     strprintf("\"%s\", but [model] init's %s holds a %s model (set [model] family "
                               "= \"%s\")",
                               name_of(d.model.family), w.file.c_str(), name_of(w.cfg.family),
                               name_of(w.cfg.family)));
  }
  if (w.cfg.llama()) {
    // Sizes: 0 in the deck takes the file's. Values with a default: a key
    // the deck gave must be the file's; one it left out is the file's.
    const std::pair<const char*, std::pair<int64_t*, int64_t>> sizes[] = {
        {"n_kv_head", {&d.model.n_kv_head, w.cfg.n_kv_head}},
        {"ffn_hidden", {&d.model.ffn_hidden, w.cfg.ffn_hidden}}};
    for (const auto& [key, v] : sizes) {
      if (*v.first != 0 && *v.first != v.second)
        throw InputError(d.path, std::string("[model] ") + key,
                         strprintf("%lld, but [model] init's %s holds %lld",
                                   static_cast<long long>(*v.first), w.file.c_str(),
                                   static_cast<long long>(v.second)));
      *v.first = v.second;
    }
    const std::pair<const char*, std::pair<double*, double>> values[] = {
        {"rope_theta", {&d.model.rope_theta, w.cfg.rope_theta}},
        {"norm_eps", {&d.model.norm_eps, w.cfg.norm_eps}}};
    for (const auto& [key, v] : values) {
      if (d.model_keys.count(key) != 0 && *v.first != v.second)
        throw InputError(d.path, std::string("[model] ") + key,
                         strprintf("%g, but [model] init's %s holds %g", *v.first, w.file.c_str(),
                                   v.second));
      *v.first = v.second;
    }
    if (d.model_keys.count("tie_embeddings") != 0 && d.model.tie_embeddings != w.cfg.tie_embeddings)
      throw InputError(d.path, "[model] tie_embeddings",
                       strprintf("%s, but [model] init's %s has tie_word_embeddings %s",
                                 d.model.tie_embeddings ? "true" : "false", w.file.c_str(),
                                 w.cfg.tie_embeddings ? "true" : "false"));
    d.model.tie_embeddings = w.cfg.tie_embeddings;
  }
  // The experts are the file's (a dense file: none); a key the deck gave
  // must agree (a dense model is not turned into experts here).
  const std::pair<const char*, std::pair<int64_t*, int64_t>> moe[] = {
      {"experts", {&d.model.experts, w.cfg.experts}},
      {"top_k", {&d.model.top_k, w.cfg.top_k}},
      {"moe_every", {&d.model.moe_every, w.cfg.moe_every}}};
  for (const auto& [key, v] : moe) {
    if (w.cfg.experts == 0 && std::string(key) != "experts") continue;  // meaningless there
    if (d.model_keys.count(key) != 0 && *v.first != v.second)
      throw InputError(d.path, std::string("[model] ") + key,
                       strprintf("%lld, but [model] init's %s holds %lld%s",
                                 static_cast<long long>(*v.first), w.file.c_str(),
                                 static_cast<long long>(v.second),
                                 w.cfg.experts == 0 ? " (a dense model)" : ""));
    *v.first = v.second;
  }
  const std::pair<const char*, std::pair<int64_t*, int64_t>> keys[] = {
      {"n_layer", {&d.model.n_layer, w.cfg.n_layer}}, {"n_head", {&d.model.n_head, w.cfg.n_head}},
      {"n_embd", {&d.model.n_embd, w.cfg.n_embd}},    {"seq_len", {&d.model.seq_len, w.cfg.seq_len}},
      {"vocab_size", {&d.model.vocab_size, w.cfg.vocab_size}}};
  for (const auto& [key, v] : keys) {
    auto& [deck_value, file_value] = v;
    if (file_value == 0 && *deck_value == 0) {
      throw InputError(d.path, std::string("[model] ") + key,
                       "missing, and " + w.file + " does not say (a .safetensors without config.json)");
    }
    if (*deck_value == 0) {
      *deck_value = file_value;
    } else if (file_value != 0 && *deck_value != file_value) {
      throw InputError(d.path, std::string("[model] ") + key,
                       strprintf("%lld, but [model] init's %s holds %lld (give the file's, or leave "
                                 "the key out to take it)",
                                 static_cast<long long>(*deck_value), w.file.c_str(),
                                 static_cast<long long>(file_value)));
    }
  }
  check_relations(d, d.path);
}

namespace {

// An optional key whose value means "not given" (vocab_size 0, no val path,
// min_lr -1) is not written, so the resolved text is itself a valid deck.
bool unset(const Key& k, const std::string& shown) {
  return k.kind == Kind::String ? shown == "\"\""
         : k.kind == Kind::Bool || k.kind == Kind::WordOrNumber ? false
                                : !(std::stod(shown) >= k.min);
}

}  // namespace

std::vector<DeckKey> deck_keys() {
  const Deck defaults;
  std::vector<DeckKey> out;
  for (const auto& k : schema()) {
    const std::string v = k.show(defaults);
    out.push_back({k.section, k.name, k.required, k.required || unset(k, v) ? "" : v});
  }
  return out;
}

std::string Deck::to_toml() const {
  std::string out, section;
  for (const auto& k : schema()) {
    if (section != k.section) {
      // The blend's tables after [data]'s own keys, before the next section.
      if (section == "data") out += data_sources_toml(data.sources);
      section = k.section;
      out += (out.empty() ? "[" : "\n[") + section + "]\n";
    }
    const std::string v = k.show(*this);
    if (!unset(k, v)) out += std::string(k.name) + " = " + v + "\n";
  }
  return out;
}

}  // namespace mpiformer

namespace mpiformer {

void rebase_relative_paths(Deck& d, const std::string& base) {
  const auto rebase = [&](std::string& p) {
    if (!p.empty() && std::filesystem::path(p).is_relative()) p = base + "/" + p;
  };
  rebase(d.data.train);
  rebase(d.data.val);
  for (DataSource& s : d.data.sources) {
    rebase(s.path);
    rebase(s.val);
  }
  rebase(d.run.dir);
  rebase(d.checkpoint.dir);
  rebase(d.checkpoint.resume_path);
  rebase(d.model_init);
  rebase(d.run.machine);
}

}  // namespace mpiformer
