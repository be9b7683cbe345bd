// Where `[model] init` reads a pretrained model's weights from: a Hugging
// Face directory (GPT-2: model.safetensors + config.json; Llama: config.json
// with model_type "llama" and one model.safetensors, or shards named by
// model.safetensors.index.json) or a GPT-2 .safetensors file, or an llm.c
// parameter file (gpt2_*.bin). F32, BF16 and F16 tensors are read. (An mpiformer checkpoint
// is read by the checkpoint reader.) Each rank reads only the blocks of the
// tensors it holds; the file is mapped, not read whole. Every problem (not
// such a file, a header that lies about sizes, a tensor missing or of the
// wrong shape or dtype) is an InputError naming the file and the tensor.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "core/gpt_config.hpp"

namespace mpiformer {

enum class WeightFormat { kHuggingFace, kLlmc, kCheckpoint };

// The model a weights file holds, as far as the file says (n_head is 0 when
// a bare .safetensors file has no config.json beside it).
struct WeightsShape {
  WeightFormat format = WeightFormat::kCheckpoint;
  GptConfig cfg;
  std::string file;  // the file itself (a directory's model.safetensors, or its index)
  // Hugging Face: every safetensors file (one, or an index's shards).
  std::vector<std::string> shards;
  // Said with the init line: which of two possible files was read.
  std::string note;
};
WeightsShape read_weights_shape(const std::string& path);

// A tensor as the file stores it: its name (safetensors) or its element
// offset (llm.c), its shape there, and whether it is the transpose of
// mpiformer's [out, in] (Hugging Face's Conv1D).
struct ForeignTensor {
  std::string name;
  int64_t offset = 0;
  std::vector<int64_t> shape;
  bool transposed = false;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Block `box` of the tensor in mpiformer's layout (rows x cols, row-major)
  // into `out`.
  virtual void read(const ForeignTensor& t, const DatasetBox& box, float* out) const = 0;
  // llm.c: the padded vocabulary rows its wte has (0 elsewhere).
  virtual int64_t padded_vocab() const { return 0; }
  // Safetensors: every tensor name the files hold (to find extra ones).
  virtual std::vector<std::string> names() const { return {}; }
};
std::unique_ptr<WeightSource> open_weight_source(const WeightsShape& shape);

// A fingerprint of the weights file's content, cheap on any size, that two
// different models' files all but never share: the file's size, its first
// 64 KiB (the header) and 64 blocks of 4 KiB spread over the rest; for a
// checkpoint, its step, run and every tensor's stored checksum. Ranks that
// each read their own slices compare these, so a rank that sees another
// file at the same path (a stale node-local copy) is found before training
// mixes two models. Text, for agree_on_view's message.
std::string weights_digest(const WeightsShape& shape);

}  // namespace mpiformer
