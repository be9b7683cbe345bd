// Model weights in other tools' file formats, written tensor by tensor
// (never the whole model in memory):
//  - safetensors (Hugging Face): an 8-byte little-endian header length, a
//    JSON header {name: {dtype, shape, data_offsets}} padded with spaces to
//    8 bytes, then the tensors' raw little-endian data back to back;
//  - llm.c's parameter file (gpt2_*.bin): 256 int32 of header (magic
//    20240326, version 3 for fp32 or 5 for bf16, then maxT, V, L, NH, C and
//    the padded V), then every parameter, in its order.
// Float data is converted on the way (bf16: rounded to nearest even). Any
// write that fails is a SystemError naming the file.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/gpt_config.hpp"

namespace mpiformer {

enum class WeightDtype { kF32, kBF16 };
size_t dtype_bytes(WeightDtype d);

// A file written front to back; close() flushes it to disk.
class WeightStream {
 public:
  WeightStream(const std::string& path, WeightDtype dtype);
  ~WeightStream();
  WeightStream(const WeightStream&) = delete;
  WeightStream& operator=(const WeightStream&) = delete;
  void bytes(const void* data, size_t n);
  // n floats in the stream's dtype.
  void floats(const float* data, int64_t n);
  void close();

 private:
  std::string path_;
  WeightDtype dtype_;
  std::FILE* file_ = nullptr;
  std::vector<uint16_t> narrow_;
};

struct WeightEntry {
  std::string name;
  std::vector<int64_t> shape;
};

// The header of a safetensors file holding `entries` in that order: write
// it, then each tensor's data in the same order.
std::string safetensors_header(const std::vector<WeightEntry>& entries, WeightDtype dtype,
                               const std::map<std::string, std::string>& metadata);

struct LlmcShape {
  int64_t max_t = 0, vocab = 0, layers = 0, heads = 0, channels = 0, padded_vocab = 0;
};
inline constexpr int32_t kLlmcWeightsMagic = 20240326;
// The 256-int32 header of an llm.c parameter file.
std::vector<int32_t> llmc_header(const LlmcShape& s, WeightDtype dtype);

// Hugging Face's config.json for a GPT2LMHeadModel of this shape (the
// GPT-2 token ids when the data's tokenizer is GPT-2's).
std::string hf_gpt2_config(const GptConfig& cfg, WeightDtype dtype, const std::string& tokenizer);
// LlamaForCausalLM's config.json for a Llama-family model.
std::string hf_llama_config(const GptConfig& cfg, WeightDtype dtype);
// model.safetensors.index.json: each tensor's shard file, and the total
// bytes of tensor data.
std::string safetensors_index(const std::map<std::string, std::string>& weight_map,
                              int64_t total_bytes);

}  // namespace mpiformer
