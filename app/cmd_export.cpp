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
#include "model/gpt2_formats.hpp"
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

void export_hf(const CheckpointReader& reader, const ParameterTable& whole, const GptConfig& cfg,
               WeightDtype dtype, const std::string& dir) {
  std::filesystem::create_directory(dir);
  std::vector<WeightEntry> entries;
  for (const auto& s : whole.specs()) {
    std::vector<int64_t> shape = s.shape;
    if (hf_transposed(s)) std::swap(shape[0], shape[1]);
    entries.push_back({hf_name(s), shape});
  }
  WeightStream out(dir + "/model.safetensors", dtype);
  const std::string header = safetensors_header(entries, dtype, {{"format", "pt"}});
  out.bytes(header.data(), header.size());
  for (const auto& s : whole.specs()) {
    const auto t = tensor_for(reader, s, hf_transposed(s), s.shape[0]);
    out.floats(t.data(), static_cast<int64_t>(t.size()));
  }
  out.close();
  write_file_durably(dir + "/config.json", hf_gpt2_config(cfg, dtype, reader.meta().tokenizer));
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
    if (args.format == "hf") {
      export_hf(reader, whole, cfg, dtype, tmp);
    } else {
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
              args.format == "hf" ? "a Hugging Face GPT2LMHeadModel directory"
                                  : "an llm.c parameter file");
  return 0;
}

}  // namespace mpiformer
