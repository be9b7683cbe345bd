#include "weight_source.hpp"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <xxhash.h>

#include "core/bf16.hpp"
#include "core/fp16.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "json_fields.hpp"
#include "deck.hpp"
#include "core/format.hpp"
#include "mapped_file.hpp"
#include "weight_files.hpp"

namespace mpiformer {
namespace {

namespace fs = std::filesystem;

// Elements at `base` (a file region of `shape`, elements of `elem` bytes:
// 4 float32, or 2 bfloat16, or 2 float16 when `half`) copied into `out`
// as mpiformer's block `box`.
void copy_box(const char* base, size_t elem, bool half, const ForeignTensor& t,
              const DatasetBox& box, float* out) {
  const auto value = [&](int64_t i) {
    const char* p = base + static_cast<size_t>(i) * elem;
    if (elem == 4) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, p, 2);
    return half ? fp16_to_float(b) : bf16_to_float(b);
  };
  const int64_t width = t.shape.size() > 1 ? t.shape[1] : 1;
  const int64_t cols = t.shape.size() > 1 ? box.cols : 1;
  for (int64_t r = 0; r < box.rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      // Ours (i, j) is the file's (j, i) when transposed.
      const int64_t i = box.row + r, j = box.col + c;
      out[r * cols + c] = value(t.transposed ? j * width + i : i * width + j);
    }
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string show(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

struct SafetensorsEntry {
  size_t elem = 4;
  bool half = false;  // F16 (elem 2), not BF16
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // in the file
};

// The header of a .safetensors file, every entry checked against the file.
std::map<std::string, SafetensorsEntry> safetensors_entries(const MappedFile& f) {
  const std::string& path = f.path();
  if (f.size() < 8) throw InputError(path, "header", "truncated: shorter than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  if (n < 2 || n > static_cast<uint64_t>(f.size() - 8)) {
    throw InputError(path, "header length",
                     strprintf("%llu bytes, but the file has %lld after it (not safetensors, or truncated)",
                               static_cast<unsigned long long>(n), static_cast<long long>(f.size() - 8)));
  }
  const nlohmann::json h = parse_json_strict(f.data() + 8, f.data() + 8 + n, path, "header");
  if (!h.is_object()) throw InputError(path, "header", "not a JSON object");
  const int64_t data_begin = 8 + static_cast<int64_t>(n), data_size = f.size() - data_begin;
  std::map<std::string, SafetensorsEntry> out;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") continue;
    try {
      SafetensorsEntry s;
      if (!e.is_object()) throw InputError(path, name, "not an entry (an object) but " + json_kind(e));
      const auto need = [&](const char* key) -> const nlohmann::json& {
        if (!e.contains(key)) throw InputError(path, name + "." + key, "missing");
        return e.at(key);
      };
      const std::string dtype = json_string(need("dtype"), path, name + ".dtype");
      if (dtype != "F32" && dtype != "BF16" && dtype != "F16") {
        throw InputError(path, name, "dtype " + dtype + ": mpiformer reads F32, BF16 and F16");
      }
      s.elem = dtype == "F32" ? 4 : 2;
      s.half = dtype == "F16";
      const nlohmann::json& shape = need("shape");
      const nlohmann::json& at = need("data_offsets");
      if (!shape.is_array()) throw InputError(path, name + ".shape", "must be an array, not " + json_kind(shape));
      if (!at.is_array() || at.size() != 2)
        throw InputError(path, name + ".data_offsets", "must be [begin, end]");
      for (const auto& d : shape) s.shape.push_back(json_integer(d, path, name + ".shape"));
      const std::vector<int64_t> offsets = {json_integer(at[0], path, name + ".data_offsets"),
                                            json_integer(at[1], path, name + ".data_offsets")};
      for (int64_t d : s.shape)
        if (d < 0 || d > (int64_t{1} << 40)) throw InputError(path, name, "shape " + show(s.shape));
      if (offsets[0] < 0 || offsets[1] < offsets[0] || offsets[1] > data_size ||
          offsets[1] - offsets[0] != numel(s.shape) * static_cast<int64_t>(s.elem)) {
        throw InputError(path, name,
                         strprintf("data_offsets [%lld, %lld] do not hold a %s %s tensor within the "
                                   "file's %lld bytes of data (a header that lies, or a truncated file)",
                                   static_cast<long long>(offsets[0]), static_cast<long long>(offsets[1]),
                                   dtype.c_str(), show(s.shape).c_str(), static_cast<long long>(data_size)));
      }
      s.begin = data_begin + offsets[0];
      s.end = data_begin + offsets[1];
      out[name] = s;
    } catch (const nlohmann::json::exception& x) {
      throw InputError(path, name, std::string("malformed entry: ") + x.what());
    }
  }
  // No two tensors share bytes (the format lays them end to end).
  std::vector<std::pair<int64_t, std::string>> by_begin;
  for (const auto& [name, e] : out)
    if (e.end > e.begin) by_begin.emplace_back(e.begin, name);
  std::sort(by_begin.begin(), by_begin.end());
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const SafetensorsEntry& a = out.at(by_begin[i - 1].second);
    const SafetensorsEntry& b = out.at(by_begin[i].second);
    if (b.begin < a.end) {
      throw InputError(path, by_begin[i].second + ".data_offsets",
                       "overlaps " + by_begin[i - 1].second + "'s bytes (a damaged or crafted header)");
    }
  }
  return out;
}

// A JSON file written by another tool, read whole (small), duplicate keys
// refused, or an InputError naming it.
nlohmann::json read_json(const std::string& path, const char* what) {
  require_regular_file(path, "", what);
  std::error_code ec;
  if (fs::file_size(path, ec) > (16 << 20)) throw InputError(path, "", std::string("over 16 MiB: not ") + what);
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_json_strict(text.data(), text.data() + text.size(), path, "");
}

// A safetensors index's weight_map: (tensor, file of the directory) pairs,
// each a string naming a file beside the index; at least one.
std::vector<std::pair<std::string, std::string>> index_weight_map(const std::string& index) {
  const nlohmann::json j = read_json(index, "a safetensors index");
  const nlohmann::json* map = json_field(j, "weight_map");
  if (map == nullptr || !map->is_object()) throw InputError(index, "weight_map", "missing, or not an object");
  if (map->empty()) throw InputError(index, "weight_map", "empty: it names no tensor");
  const std::string dir = fs::path(index).parent_path().string();
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  for (const auto& [name, f] : map->items()) {
    const std::string file = json_string(f, index, "weight_map." + name);
    if (file.empty() || file.find('/') != std::string::npos)
      throw InputError(index, "weight_map." + name, "\"" + file + "\": not a file of the directory");
    if (!fs::exists(dir + "/" + file, ec))
      throw InputError(index, "weight_map." + name, "names " + file + ", which does not exist");
    out.emplace_back(name, file);
  }
  return out;
}

// One safetensors file or several (a sharded directory); a tensor is
// looked up by name in all of them.
class SafetensorsSource final : public WeightSource {
 public:
  // `index`: the shard index the paths came from ("" for one file), whose
  // every entry must name a tensor its shard holds.
  SafetensorsSource(const std::vector<std::string>& paths, const std::string& index) {
    if (paths.empty()) throw InputError(index, "weight_map", "names no tensor file");
    named_ = index.empty() ? paths.front() : index;
    for (const std::string& p : paths) {
      files_.push_back(std::make_unique<MappedFile>(p));
      for (auto& [name, e] : safetensors_entries(*files_.back())) {
        if (entries_.count(name) != 0) {
          throw InputError(p, name, "also in " + files_[entries_.at(name).first]->path() +
                                        " (a tensor in two shards)");
        }
        entries_[name] = {files_.size() - 1, e};
      }
    }
    if (index.empty()) return;
    for (const auto& [name, file] : index_weight_map(index)) {
      const auto it = entries_.find(name);
      if (it == entries_.end())
        throw InputError(index, "weight_map." + name, "names a tensor no shard holds (" + file + ")");
      const std::string holder = fs::path(files_[it->second.first]->path()).filename().string();
      if (holder != file)
        throw InputError(index, "weight_map." + name, "names " + file + ", but the tensor is in " + holder);
    }
  }
  void read(const ForeignTensor& t, const DatasetBox& box, float* out) const override {
    // GPT2LMHeadModel's names; GPT2Model's (and OpenAI's own upload) lack
    // the "transformer." prefix.
    auto it = entries_.find(t.name);
    const std::string bare = t.name.rfind("transformer.", 0) == 0 ? t.name.substr(12) : t.name;
    if (it == entries_.end()) it = entries_.find(bare);
    if (it == entries_.end()) throw InputError(named_, t.name, "missing");
    const MappedFile& file = *files_[it->second.first];
    const SafetensorsEntry& e = it->second.second;
    if (e.shape != t.shape) {
      throw InputError(file.path(), t.name,
                       "shape " + show(e.shape) + ", the model needs " + show(t.shape));
    }
    copy_box(file.data() + e.begin, e.elem, e.half, t, box, out);
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, e] : entries_) out.push_back(name);
    return out;
  }

 private:
  std::string named_;  // the index, or the one file: what a message names
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, std::pair<size_t, SafetensorsEntry>> entries_;  // name -> (file, entry)
};

class LlmcSource final : public WeightSource {
 public:
  explicit LlmcSource(const std::string& path) : file_(path) {
    const int32_t* h = reinterpret_cast<const int32_t*>(file_.data());
    elem_ = h[1] == 3 ? 4 : 2;
    padded_ = h[7];
  }
  void read(const ForeignTensor& t, const DatasetBox& box, float* out) const override {
    const int64_t bytes = 1024 + (t.offset + numel(t.shape)) * static_cast<int64_t>(elem_);
    if (bytes > file_.size()) {
      throw InputError(file_.path(), t.name,
                       strprintf("ends at byte %lld, past the end of the file (%lld bytes): truncated",
                                 static_cast<long long>(bytes), static_cast<long long>(file_.size())));
    }
    copy_box(file_.data() + 1024 + t.offset * static_cast<int64_t>(elem_), elem_, false, t, box, out);
  }
  int64_t padded_vocab() const override { return padded_; }

 private:
  MappedFile file_;
  size_t elem_ = 4;
  int64_t padded_ = 0;
};

WeightsShape llmc_shape(const std::string& path) {
  MappedFile f(path);
  if (f.size() < 1024) throw InputError(path, "header", "truncated: shorter than llm.c's 256-int32 header");
  const int32_t* h = reinterpret_cast<const int32_t*>(f.data());
  if (h[1] != 3 && h[1] != 5) {
    throw InputError(path, "header version", strprintf("%d: llm.c's fp32 (3) and bf16 (5) files are read", h[1]));
  }
  WeightsShape s;
  s.format = WeightFormat::kLlmc;
  s.file = path;
  s.cfg.seq_len = h[2];
  s.cfg.vocab_size = h[3];
  s.cfg.n_layer = h[4];
  s.cfg.n_head = h[5];
  s.cfg.n_embd = h[6];
  // Before any size is computed from them (their products overflow int64
  // otherwise).
  check_model_limits(s.cfg, path, "header ");
  if (h[7] > 2 * (1 << 24)) {
    throw InputError(path, "header padded vocabulary", strprintf("%d: more than twice the largest vocabulary", h[7]));
  }
  if (h[2] < 1 || h[3] < 1 || h[4] < 1 || h[5] < 1 || h[6] < 1 || h[7] < h[3] || h[6] % h[5] != 0) {
    throw InputError(path, "header", strprintf("not a model's shape: maxT %d, V %d, L %d, NH %d, C %d, Vp %d",
                                               h[2], h[3], h[4], h[5], h[6], h[7]));
  }
  // Every parameter's count, as the file's order lays them out.
  const int64_t C = h[6], L = h[4];
  const int64_t n = int64_t{h[7]} * C + int64_t{h[2]} * C + L * (12 * C * C + 13 * C) + 2 * C;
  const int64_t want = 1024 + n * (h[1] == 3 ? 4 : 2);
  if (f.size() != want) {
    throw InputError(path, "size", strprintf("%lld bytes, the header's model needs %lld%s",
                                             static_cast<long long>(f.size()), static_cast<long long>(want),
                                             f.size() < want ? " (truncated)" : ""));
  }
  return s;
}

WeightsShape safetensors_shape(const std::string& file, const std::string& config) {
  MappedFile f(file);
  const auto entries = safetensors_entries(f);
  WeightsShape s;
  s.format = WeightFormat::kHuggingFace;
  s.file = file;
  s.shards = {file};
  const auto get = [&](const std::string& name) -> const SafetensorsEntry& {
    for (const std::string& n : {"transformer." + name, name}) {
      const auto it = entries.find(n);
      if (it != entries.end() && it->second.shape.size() == 2) return it->second;
    }
    throw InputError(file, "transformer." + name, "missing (is this a GPT-2 model?)");
  };
  s.cfg.vocab_size = get("wte.weight").shape[0];
  s.cfg.n_embd = get("wte.weight").shape[1];
  s.cfg.seq_len = get("wpe.weight").shape[0];
  const std::regex block(R"((transformer\.)?h\.(\d+)\.ln_1\.weight)");
  for (const auto& [name, e] : entries) {
    std::smatch m;
    if (!std::regex_match(name, m, block)) continue;
    // Six digits pass the parse; the limits below decide.
    if (m[2].length() > 6) throw InputError(file, name, "a layer number beyond any model's");
    s.cfg.n_layer = std::max<int64_t>(s.cfg.n_layer, std::stoll(m[2]) + 1);
  }
  std::error_code ec;
  if (!config.empty() && fs::exists(fs::symlink_status(config, ec))) {
    const nlohmann::json c = read_json(config, "a GPT-2 config.json");
    if (json_field(c, "n_head") == nullptr) throw InputError(config, "n_head", "missing (a GPT2Config key)");
    s.cfg.n_head = json_integer(c, "n_head", config, 0);
    for (const auto& [key, v] : {std::pair{"n_layer", s.cfg.n_layer}, {"n_embd", s.cfg.n_embd},
                                 {"n_positions", s.cfg.seq_len}, {"vocab_size", s.cfg.vocab_size}}) {
      const int64_t given = json_integer(c, key, config, v);
      if (given != v) {
        throw InputError(config, key, strprintf("%lld, but the weights say %lld",
                                                static_cast<long long>(given), static_cast<long long>(v)));
      }
    }
    check_imported_model(s.cfg, config, {{"n_head", "n_head"}});
  }
  check_model_limits(s.cfg, file, "the weights' ");
  return s;
}

// A Hugging Face Llama directory: the shape from config.json (LlamaConfig's
// keys), the files from model.safetensors or the shard index. What
// mpiformer's Llama does not compute (rotary scaling, biases, another
// activation) is refused by name rather than trained wrong. Mixtral's
// (model_type "mixtral"): a Llama whose every MLP is num_local_experts
// experts, num_experts_per_tok of them per token; no sliding window.
WeightsShape llama_directory_shape(const std::string& dir, const nlohmann::json& c, bool mixtral) {
  const std::string config = dir + "/config.json";
  WeightsShape s;
  s.format = WeightFormat::kHuggingFace;
  GptConfig& m = s.cfg;
  m.family = ModelFamily::kLlama;
  // Every field typed (json_fields.hpp): a fraction, a string or null
  // where a count belongs is refused by name, never truncated.
  const auto need = [&](const char* key) {
    const nlohmann::json* v = json_field(c, key);
    if (v == nullptr) throw InputError(config, key, "missing (a LlamaConfig key)");
    return json_integer(*v, config, key);
  };
  m.n_layer = need("num_hidden_layers");
  m.n_head = need("num_attention_heads");
  m.n_embd = need("hidden_size");
  m.ffn_hidden = need("intermediate_size");
  m.vocab_size = need("vocab_size");
  m.seq_len = need("max_position_embeddings");
  m.n_kv_head = json_integer(c, "num_key_value_heads", config, m.n_head);
  m.rope_theta = json_number(c, "rope_theta", config, 10000.0);
  m.norm_eps = json_number(c, "rms_norm_eps", config, 1e-6);
  m.tie_embeddings = json_bool(c, "tie_word_embeddings", config, false);
  if (json_field(c, "rope_scaling") != nullptr)
    throw InputError(config, "rope_scaling", "rotary scaling is not supported (mpiformer's RoPE is unscaled)");
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (json_bool(c, bias, config, false))
      throw InputError(config, bias, "biases are not part of mpiformer's Llama");
  const std::string act = json_string(c, "hidden_act", config, "silu");
  if (act != "silu")
    throw InputError(config, "hidden_act", "\"" + act + "\": mpiformer's Llama MLP is SwiGLU (silu)");
  if (json_field(c, "head_dim") != nullptr && m.n_head > 0 &&
      json_integer(c, "head_dim", config, 0) * m.n_head != m.n_embd)
    throw InputError(config, "head_dim", "head_dim x num_attention_heads must be hidden_size");
  if (mixtral) {
    m.experts = need("num_local_experts");
    m.top_k = need("num_experts_per_tok");
    m.moe_every = 1;
    if (json_field(c, "sliding_window") != nullptr)
      throw InputError(config, "sliding_window",
                       "sliding-window attention is not supported (mpiformer attends to the "
                       "whole window)");
    if (m.experts < 1 || m.top_k < 1 || m.top_k > m.experts)
      throw InputError(config, "num_experts_per_tok",
                       "must be between 1 and num_local_experts (at least 1)");
  }
  // The deck's limits, every one, under the file's own names: a value the
  // deck would refuse is refused here (0 included), naming config.json's
  // field.
  check_imported_model(m, config,
                       {{"n_layer", "num_hidden_layers"}, {"n_head", "num_attention_heads"},
                        {"n_embd", "hidden_size"}, {"ffn_hidden", "intermediate_size"},
                        {"vocab_size", "vocab_size"}, {"seq_len", "max_position_embeddings"},
                        {"n_kv_head", "num_key_value_heads"}, {"rope_theta", "rope_theta"},
                        {"norm_eps", "rms_norm_eps"}, {"experts", "num_local_experts"},
                        {"top_k", "num_experts_per_tok"}});
  if (m.n_kv_head > m.n_head)
    throw InputError(config, "num_key_value_heads", "must be between 1 and num_attention_heads");
  // As transformers does: model.safetensors when there is one, else the
  // shard index (said with the init line when both are there).
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  std::error_code ec;
  const bool has_single = fs::exists(fs::symlink_status(single, ec));
  const bool has_index = fs::exists(fs::symlink_status(index, ec));
  if (has_single) {
    s.file = single;
    s.shards = {single};
    if (has_index) s.note = "model.safetensors read; model.safetensors.index.json beside it ignored, as transformers does";
  } else if (has_index) {
    std::set<std::string> files;
    for (const auto& [name, file] : index_weight_map(index)) files.insert(file);
    for (const std::string& f : files) s.shards.push_back(dir + "/" + f);
    s.file = index;
  } else {
    throw InputError(dir, "[model] init", "a Llama directory without model.safetensors or its index");
  }
  return s;
}

}  // namespace

WeightsShape read_weights_shape(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string config = path + "/config.json";
    // A config that is not a regular file is GPT-2's reader's to report.
    if (fs::is_regular_file(config, ec)) {
      const nlohmann::json c = read_json(config, "a config.json");
      const std::string type = json_string(c, "model_type", config, "");
      if (type == "llama" || type == "mixtral") return llama_directory_shape(path, c, type == "mixtral");
    }
    const std::string file = path + "/model.safetensors";
    if (!fs::exists(file, ec)) throw InputError(path, "[model] init", "a directory without model.safetensors");
    return safetensors_shape(file, path + "/config.json");
  }
  if (!fs::exists(path, ec)) throw InputError(path, "[model] init", "does not exist");
  if (!fs::is_regular_file(path, ec)) {
    throw InputError(path, "[model] init", "not a regular file or a directory (a FIFO or a device?)");
  }
  int32_t magic = 0;
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(&magic), 4);
  if (magic == kLlmcWeightsMagic) return llmc_shape(path);
  if (is_checkpoint(path)) {
    const CheckpointReader r(path);  // checks the model's shape against the limits
    return WeightsShape{WeightFormat::kCheckpoint, model_config(r.meta()), path, {}, {}};
  }
  if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) {
    return safetensors_shape(path, (fs::path(path).parent_path() / "config.json").string());
  }
  throw InputError(path, "[model] init",
                   "not a weights file mpiformer reads: a Hugging Face directory or .safetensors, an "
                   "llm.c parameter file (magic 20240326) or an mpiformer checkpoint");
}

std::unique_ptr<WeightSource> open_weight_source(const WeightsShape& shape) {
  if (shape.format == WeightFormat::kLlmc) return std::make_unique<LlmcSource>(shape.file);
  if (shape.format == WeightFormat::kHuggingFace) {
    const bool indexed = shape.file.size() > 11 && shape.file.compare(shape.file.size() - 11, 11, ".index.json") == 0;
    return std::make_unique<SafetensorsSource>(shape.shards, indexed ? shape.file : std::string());
  }
  throw std::logic_error("open_weight_source: checkpoints are read by CheckpointReader");
}

std::string weights_digest(const WeightsShape& shape) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::string size;
  if (shape.format == WeightFormat::kCheckpoint) {
    const CheckpointReader r(shape.file);
    const CheckpointMeta& m = r.meta();
    const std::string head = strprintf("step %lld run %s", static_cast<long long>(m.step), m.run_id.c_str());
    XXH64_update(state, head.data(), head.size());
    for (const auto& [name, dims] : r.datasets()) {
      if (name.rfind("/model/", 0) != 0) continue;  // init reads the weights only
      const uint64_t stored = r.read_rows(name, dims, 0, 0, nullptr);
      XXH64_update(state, &stored, sizeof stored);
    }
    size = "step " + std::to_string(m.step);
  } else {
    int64_t total = 0;
    const std::vector<std::string> files = shape.shards.empty() ? std::vector<std::string>{shape.file}
                                                                : shape.shards;
    for (const std::string& file : files) {
      const MappedFile f(file);
      const int64_t n = f.size(), head = std::min<int64_t>(n, 64 << 10), block = 4096;
      XXH64_update(state, &n, sizeof n);
      XXH64_update(state, f.data(), static_cast<size_t>(head));
      for (int i = 0; i < 64 && n - head > block; ++i) {
        const int64_t at = head + (n - head - block) * i / 63;
        XXH64_update(state, f.data() + at, block);
      }
      total += n;
    }
    size = std::to_string(total) + " bytes";
  }
  const uint64_t digest = XXH64_digest(state);
  XXH64_freeState(state);
  return strprintf("%s, content digest %016llx", size.c_str(), static_cast<unsigned long long>(digest));
}

}  // namespace mpiformer
