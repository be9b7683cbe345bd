#include "model/parameter_table.hpp"

#include <cmath>
#include <stdexcept>

namespace mpiformer {

StageRange partition_stage(const GptConfig& cfg, int64_t stage, int64_t num_stages) {
  const int64_t base = cfg.n_layer / num_stages, extra = cfg.n_layer % num_stages;
  StageRange r;
  r.first_layer = stage * base + std::min(stage, extra);
  r.last_layer = r.first_layer + base + (stage < extra ? 1 : 0);
  r.has_embedding = stage == 0;
  r.has_head = stage == num_stages - 1;
  return r;
}

int64_t ParameterSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void ParameterTable::add(std::string name, std::vector<int64_t> shape, bool decay, double std,
                         double value, int64_t storage) {
  ParameterSpec s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.decay = decay;
  s.init_std = std;
  s.init_value = value;
  s.storage = storage < 0 ? s.numel() : storage;
  // Keep every tensor 16-element aligned so vector loads never straddle two.
  s.offset = total_;
  total_ += (s.storage + 15) / 16 * 16;
  specs_.push_back(std::move(s));
}

ParameterTable::ParameterTable(const GptConfig& cfg, const StageRange& range) {
  const int64_t C = cfg.n_embd;
  const double std = 0.02;
  // GPT-2 scales the projections that write into the residual stream by
  // 1/sqrt(2 * n_layer) so the stream's variance does not grow with depth.
  const double proj_std = std / std::sqrt(2.0 * static_cast<double>(cfg.n_layer));
  if (range.has_embedding || range.has_head) {
    // The tied embedding / LM head; padded rows stay zero for ever.
    add("wte", {cfg.vocab_size, C}, true, std, 0.0, cfg.padded_vocab() * C);
  }
  if (range.has_embedding) add("wpe", {cfg.seq_len, C}, true, std, 0.0);
  for (int64_t l = range.first_layer; l < range.last_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C}, false, 0.0, 1.0);
    add(h + "ln_1.bias", {C}, false, 0.0, 0.0);
    add(h + "attn.c_attn.weight", {3 * C, C}, true, std, 0.0);
    add(h + "attn.c_attn.bias", {3 * C}, false, 0.0, 0.0);
    add(h + "attn.c_proj.weight", {C, C}, true, proj_std, 0.0);
    add(h + "attn.c_proj.bias", {C}, false, 0.0, 0.0);
    add(h + "ln_2.weight", {C}, false, 0.0, 1.0);
    add(h + "ln_2.bias", {C}, false, 0.0, 0.0);
    add(h + "mlp.c_fc.weight", {4 * C, C}, true, std, 0.0);
    add(h + "mlp.c_fc.bias", {4 * C}, false, 0.0, 0.0);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, true, proj_std, 0.0);
    add(h + "mlp.c_proj.bias", {C}, false, 0.0, 0.0);
  }
  if (range.has_head) {
    add("ln_f.weight", {C}, false, 0.0, 1.0);
    add("ln_f.bias", {C}, false, 0.0, 0.0);
  }
}

const ParameterSpec& ParameterTable::at(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return s;
  throw std::out_of_range("ParameterTable: no parameter named " + name);
}

int64_t ParameterTable::total_numel() const {
  int64_t n = 0;
  for (const auto& s : specs_) n += s.numel();
  return n;
}

}  // namespace mpiformer
