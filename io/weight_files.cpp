#include "weight_files.hpp"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/output_file.hpp"

namespace mpiformer {

size_t dtype_bytes(WeightDtype d) { return d == WeightDtype::kF32 ? 4 : 2; }

WeightStream::WeightStream(const std::string& path, WeightDtype dtype)
    : path_(path), dtype_(dtype), file_(open_output_stream(path, OutputMode::kReplace, "--output")) {}

WeightStream::~WeightStream() {
  if (file_ != nullptr) std::fclose(file_);
}

void WeightStream::bytes(const void* data, size_t n) {
  if (n > 0 && std::fwrite(data, 1, n, file_) != n)
    throw SystemError("cannot write " + path_ + ": " + std::strerror(errno));
}

void WeightStream::floats(const float* data, int64_t n) {
  // The formats are little-endian, as every machine this builds for.
  if (dtype_ == WeightDtype::kF32) return bytes(data, sizeof(float) * static_cast<size_t>(n));
  narrow_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) narrow_[i] = float_to_bf16(data[i]);
  bytes(narrow_.data(), sizeof(uint16_t) * narrow_.size());
}

void WeightStream::close() {
  std::FILE* f = file_;
  file_ = nullptr;
  const bool flushed = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const std::string why = flushed ? "" : std::strerror(errno);
  if (std::fclose(f) != 0 || !flushed)
    throw SystemError("cannot write " + path_ + ": " + (flushed ? std::strerror(errno) : why));
}

std::string safetensors_header(const std::vector<WeightEntry>& entries, WeightDtype dtype,
                               const std::map<std::string, std::string>& metadata) {
  // nlohmann's ordered_json keeps the entries in file order, which readers
  // do not need but people reading the header do.
  nlohmann::ordered_json h;
  h["__metadata__"] = metadata;
  int64_t at = 0;
  for (const WeightEntry& e : entries) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    const int64_t end = at + n * static_cast<int64_t>(dtype_bytes(dtype));
    h[e.name] = {{"dtype", dtype == WeightDtype::kF32 ? "F32" : "BF16"},
                 {"shape", e.shape},
                 {"data_offsets", {at, end}}};
    at = end;
  }
  std::string json = h.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + json;
}

std::vector<int32_t> llmc_header(const LlmcShape& s, WeightDtype dtype) {
  std::vector<int32_t> h(256, 0);
  h[0] = kLlmcWeightsMagic;
  h[1] = dtype == WeightDtype::kF32 ? 3 : 5;
  const int64_t values[6] = {s.max_t, s.vocab, s.layers, s.heads, s.channels, s.padded_vocab};
  for (int i = 0; i < 6; ++i) h[2 + i] = static_cast<int32_t>(values[i]);
  return h;
}

std::string hf_gpt2_config(const GptConfig& cfg, WeightDtype dtype, const std::string& tokenizer) {
  // GPT2Config's fields; mpiformer trains without dropout, hence the zeros.
  nlohmann::ordered_json c;
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  c["vocab_size"] = cfg.vocab_size;
  c["n_positions"] = cfg.seq_len;
  c["n_ctx"] = cfg.seq_len;
  c["n_embd"] = cfg.n_embd;
  c["n_layer"] = cfg.n_layer;
  c["n_head"] = cfg.n_head;
  c["n_inner"] = nullptr;  // 4 x n_embd
  c["activation_function"] = "gelu_new";
  c["layer_norm_epsilon"] = 1e-5;
  c["initializer_range"] = 0.02;
  c["resid_pdrop"] = 0.0;
  c["embd_pdrop"] = 0.0;
  c["attn_pdrop"] = 0.0;
  c["scale_attn_weights"] = true;
  c["tie_word_embeddings"] = true;
  if (tokenizer == "gpt2") {
    c["bos_token_id"] = 50256;  // <|endoftext|>, which prep puts before each document
    c["eos_token_id"] = 50256;
  }
  c["torch_dtype"] = dtype == WeightDtype::kF32 ? "float32" : "bfloat16";
  return c.dump(2) + "\n";
}

std::string hf_llama_config(const GptConfig& cfg, WeightDtype dtype) {
  // LlamaConfig's fields; no dropout, no bias, rotary without scaling.
  nlohmann::ordered_json c;
  // A Mixture of Experts: Mixtral's (every layer sparse; the caller
  // refuses others), its router's top k renormalised as ours.
  c["architectures"] = {cfg.moe() ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  c["model_type"] = cfg.moe() ? "mixtral" : "llama";
  c["vocab_size"] = cfg.vocab_size;
  c["hidden_size"] = cfg.n_embd;
  c["intermediate_size"] = cfg.ffn();
  c["num_hidden_layers"] = cfg.n_layer;
  c["num_attention_heads"] = cfg.n_head;
  c["num_key_value_heads"] = cfg.kv_heads();
  c["head_dim"] = cfg.head_dim();
  c["max_position_embeddings"] = cfg.seq_len;
  c["hidden_act"] = "silu";
  c["rms_norm_eps"] = cfg.norm_eps;
  c["rope_theta"] = cfg.rope_theta;
  c["rope_scaling"] = nullptr;
  c["attention_bias"] = false;
  c["mlp_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["initializer_range"] = 0.02;
  c["tie_word_embeddings"] = cfg.tie_embeddings;
  if (cfg.moe()) {
    c["num_local_experts"] = cfg.experts;
    c["num_experts_per_tok"] = cfg.top_k;
    c["router_aux_loss_coef"] = cfg.aux_loss;
    c["output_router_logits"] = false;
    c["sliding_window"] = nullptr;
  }
  c["torch_dtype"] = dtype == WeightDtype::kF32 ? "float32" : "bfloat16";
  return c.dump(2) + "\n";
}

std::string safetensors_index(const std::map<std::string, std::string>& weight_map,
                              int64_t total_bytes) {
  nlohmann::ordered_json j;
  j["metadata"] = {{"total_size", total_bytes}};
  j["weight_map"] = weight_map;
  return j.dump(2) + "\n";
}

}  // namespace mpiformer
