// `mpiformer export`: a checkpoint's weights for another tool. Every tensor
// is read (and its checksum verified) one at a time and written in the
// format's names, layouts and order (model/gpt2_formats.hpp). The output
// appears whole or not at all: it is written under OUTPUT.tmp, flushed, and
// renamed; an existing OUTPUT is never touched.
#include <filesystem>
#include <map>
#include <vector>

#include "checkpoint.hpp"
#include "commands.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "model/gpt2_formats.hpp"
#include "model/llama_formats.hpp"
#include "weight_files.hpp"

namespace mpiformer {
namespace {

// One tensor of the checkpoint, as the format stores it.
std::vector<float> tensor_for(const CheckpointReader& reader, const ParameterSpec& s,
                              bool transpose, int64_t rows_out) {
  std::vector<float> t(static_cast<size_t>(s.numel()));
  reader.read("/model/" + s.name, s.shape, t.data());
  if (transpose) {
    const int64_t r = s.shape[0], c = s.shape[1];
    std::vector<float> out(t.size());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) out[j * r + i] = t[i * c + j];
    return out;
  }
  t.resize(static_cast<size_t>(rows_out * s.row_length()), 0.0f);  // padding rows are zero
  return t;
}

// One tensor of a Hugging Face export: rows [row, row + shape[0]) of one of
// ours (all of it for GPT-2; Llama's q, k, v and gate, up are parts of
// fused tensors), transposed where HF's layout is (GPT-2's Conv1D).
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  const ParameterSpec* spec;
  int64_t row;
  bool transposed;
};

std::vector<HfTensor> hf_tensors(const ParameterTable& whole, const GptConfig& cfg) {
  std::vector<HfTensor> out;
  for (const auto& s : whole.specs()) {
    if (!cfg.llama()) {
      std::vector<int64_t> shape = s.shape;
      if (hf_transposed(s)) std::swap(shape[0], shape[1]);
      out.push_back({hf_name(s), shape, &s, 0, hf_transposed(s)});
      continue;
    }
    for (const HfPart& p : hf_llama_parts(s)) {
      std::vector<int64_t> shape = s.shape;
      shape[0] = p.rows;
      out.push_back({p.name, shape, &s, p.row, false});
    }
  }
  return out;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The tensors in order, cut into shard files of at most `max_shard_bytes`
// each (a tensor larger than that alone in its file), as Hugging Face's
// save_pretrained does: one model.safetensors, or model-0000k-of-0000n
// files and an index naming each tensor's file.
void export_hf(const CheckpointReader& reader, const ParameterTable& whole, const GptConfig& cfg,
               WeightDtype dtype, int64_t max_shard_bytes, const std::string& dir) {
  std::filesystem::create_directory(dir);
  const std::vector<HfTensor> tensors = hf_tensors(whole, cfg);
  std::vector<std::pair<size_t, size_t>> shards;  // [first, last) of tensors
  int64_t bytes = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = numel_of(tensors[i].shape) * static_cast<int64_t>(dtype_bytes(dtype));
    if (shards.empty() || (bytes > 0 && bytes + b > max_shard_bytes)) {
      shards.push_back({i, i});
      bytes = 0;
    }
    shards.back().second = i + 1;
    bytes += b;
    total += b;
  }
  const size_t n = shards.size();
  std::map<std::string, std::string> weight_map;
  const ParameterSpec* cached = nullptr;  // a fused tensor is read once for its parts
  std::vector<float> data;
  for (size_t k = 0; k < n; ++k) {
    const std::string file = n == 1 ? "model.safetensors"
                                     : strprintf("model-%05zu-of-%05zu.safetensors", k + 1, n);
    std::vector<WeightEntry> entries;
    for (size_t i = shards[k].first; i < shards[k].second; ++i) {
      entries.push_back({tensors[i].name, tensors[i].shape});
      weight_map[tensors[i].name] = file;
    }
    WeightStream out(dir + "/" + file, dtype);
    const std::string header = safetensors_header(entries, dtype, {{"format", "pt"}});
    out.bytes(header.data(), header.size());
    for (size_t i = shards[k].first; i < shards[k].second; ++i) {
      const HfTensor& t = tensors[i];
      if (t.spec != cached) {
        data = tensor_for(reader, *t.spec, t.transposed, t.spec->shape[0]);
        cached = t.spec;
      }
      const int64_t width = numel_of(t.shape) / t.shape[0];
      out.floats(data.data() + t.row * width, numel_of(t.shape));
    }
    out.close();
  }
  if (n > 1) write_file_durably(dir + "/model.safetensors.index.json", safetensors_index(weight_map, total));
  write_file_durably(dir + "/config.json", cfg.llama()
                                               ? hf_llama_config(cfg, dtype)
                                               : hf_gpt2_config(cfg, dtype, reader.meta().tokenizer));
}

void export_llmc(const CheckpointReader& reader, const ParameterTable& whole, const GptConfig& cfg,
                 WeightDtype dtype, const std::string& path) {
  WeightStream out(path, dtype);
  const LlmcShape shape{cfg.seq_len, cfg.vocab_size, cfg.n_layer,
                        cfg.n_head,  cfg.n_embd,     cfg.padded_vocab()};
  const std::vector<int32_t> header = llmc_header(shape, dtype);
  out.bytes(header.data(), sizeof(int32_t) * header.size());
  for (const ParameterSpec* s : llmc_order(whole)) {
    // wte with llm.c's padded rows.
    const int64_t rows = s->tensor == outer::wte && s->layer < 0 ? cfg.padded_vocab() : s->shape[0];
    const auto t = tensor_for(reader, *s, false, rows);
    out.floats(t.data(), static_cast<int64_t>(t.size()));
  }
  out.close();
}

}  // namespace

int run_export(const ExportArgs& args, int rank) {
  if (rank != 0) return 0;  // one writer; the other ranks of a launch have nothing to do
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(args.output, ec)) {
    throw InputError(args.output, "--output",
                     "exists; export never overwrites (remove it, or choose another name)");
  }
  const fs::path parent = fs::absolute(args.output).parent_path();
  if (!fs::is_directory(parent, ec)) {
    throw InputError(args.output, "--output", "its directory " + parent.string() + " does not exist");
  }
  const CheckpointReader reader(args.checkpoint);
  const GptConfig cfg = model_config(reader.meta());
  const ParameterTable whole(cfg, StageRange{0, cfg.n_layer, true, true});
  const WeightDtype dtype = args.dtype == "bf16" ? WeightDtype::kBF16 : WeightDtype::kF32;
  const std::string tmp = args.output + ".tmp";
  fs::remove_all(tmp, ec);  // a previous export that died
  try {
    if (args.format == "hf" && cfg.moe() && (!cfg.llama() || cfg.moe_every != 1)) {
      throw InputError(args.checkpoint, "--format",
                       strprintf("hf: a Mixture of Experts exports as Mixtral, a Llama with every "
                                 "layer sparse; this checkpoint's is %s with moe_every %lld",
                                 cfg.llama() ? "a Llama" : "GPT-2",
                                 static_cast<long long>(cfg.moe_every)));
    }
    if (args.format == "hf") {
      export_hf(reader, whole, cfg, dtype, static_cast<int64_t>(args.max_shard_mb * (1 << 20)), tmp);
    } else {
      if (cfg.llama() || cfg.moe()) {
        throw InputError(args.checkpoint, "--format",
                         std::string("llmc: llm.c's parameter file holds GPT-2 only; this "
                                     "checkpoint is ") +
                             (cfg.moe() ? "a Mixture of Experts" : "a Llama model (export it with --format hf)"));
      }
      export_llmc(reader, whole, cfg, dtype, tmp);
    }
    durable_rename(tmp, args.output);
  } catch (const SystemError& e) {
    // A directory that cannot be written, a full disk: the user's to fix.
    fs::remove_all(tmp, ec);
    throw InputError(args.output, "--output", e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  std::printf("exported %s (step %lld, %lld parameters, %s) to %s as %s\n", args.checkpoint.c_str(),
              static_cast<long long>(reader.meta().step),
              static_cast<long long>(whole.total_numel()), args.dtype.c_str(),
              args.output.c_str(),
              args.format != "hf" ? "an llm.c parameter file"
              : cfg.moe()         ? "a Hugging Face MixtralForCausalLM directory"
              : cfg.llama()       ? "a Hugging Face LlamaForCausalLM directory"
                                  : "a Hugging Face GPT2LMHeadModel directory");
  return 0;
}

}  // namespace mpiformer
