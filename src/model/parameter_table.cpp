#include "model/parameter_table.hpp"

#include "model/stage_layout.hpp"

#include <algorithm>
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

const TensorSchema& ParameterSpec::schema() const {
  return layer >= 0 ? kBlockSchema[tensor] : kOuterSchema[tensor];
}

namespace {

int64_t resolve(const Extent& e, const GptConfig& cfg) {
  switch (e.size) {
    case Extent::kEmbd:
      return e.times * cfg.n_embd;
    case Extent::kVocab:
      return e.times * cfg.vocab_size;
    case Extent::kSeqLen:
      return e.times * cfg.seq_len;
  }
  return 0;
}

}  // namespace

void ParameterTable::add(const GptConfig& cfg, const TensorSchema& schema, std::string name,
                         int64_t layer, int tensor) {
  ParameterSpec s;
  s.name = std::move(name);
  s.shape = {resolve(schema.rows, cfg)};
  if (schema.cols.times > 0) s.shape.push_back(resolve(schema.cols, cfg));
  s.decay = schema.decay;
  constexpr double kStd = 0.02;
  switch (schema.init) {
    case Init::kNormal:
      s.init_std = kStd;
      break;
    case Init::kResidualNormal:
      s.init_std = kStd / std::sqrt(2.0 * static_cast<double>(cfg.n_layer));
      break;
    case Init::kOne:
      s.init_value = 1.0;
      break;
    case Init::kZero:
      break;
  }
  s.layer = layer;
  s.tensor = tensor;
  // The vocabulary is padded in storage (GptConfig::padded_vocab); the padded
  // rows stay zero for ever.
  s.storage = schema.rows.size == Extent::kVocab ? s.numel() / cfg.vocab_size * cfg.padded_vocab()
                                                 : s.numel();
  // Keep every tensor 16-element aligned so vector loads never straddle two.
  s.offset = total_;
  total_ += (s.storage + 15) / 16 * 16;
  specs_.push_back(std::move(s));
}

ParameterTable::ParameterTable(const GptConfig& cfg, const StageRange& range) {
  // Buffer order: the first stage's tensors (the tied wte also on the last
  // stage, where it is the LM head), the blocks, the last stage's tensors.
  for (int k = 0; k < outer::kCount; ++k) {
    const TensorSchema& t = kOuterSchema[k];
    if (t.placement == Placement::kFirstStage &&
        (range.has_embedding || (k == outer::wte && range.has_head)))
      add(cfg, t, t.name, -1, k);
  }
  for (int64_t l = range.first_layer; l < range.last_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    for (int k = 0; k < block::kCount; ++k) add(cfg, kBlockSchema[k], h + kBlockSchema[k].name, l, k);
  }
  for (int k = 0; k < outer::kCount; ++k) {
    const TensorSchema& t = kOuterSchema[k];
    if (t.placement == Placement::kLastStage && range.has_head) add(cfg, t, t.name, -1, k);
  }
}

const ParameterSpec* ParameterTable::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
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

std::vector<AdamWChunk> adamw_chunks(const ParameterTable& table) {
  std::vector<AdamWChunk> chunks;
  for (const auto& s : table.specs()) append_adamw_chunks(chunks, s.offset, s.numel(), s.decay);
  return chunks;
}

StageLayout::StageLayout(const ParameterTable& table, const StageRange& range)
    : layers(static_cast<size_t>(range.num_layers())) {
  outer.fill(-1);
  std::vector<std::array<bool, block::kCount>> seen(layers.size());
  for (const auto& s : table.specs()) {
    if (s.layer < 0) {
      outer[s.tensor] = s.offset;
      continue;
    }
    const auto i = static_cast<size_t>(s.layer - range.first_layer);
    layers.at(i)[s.tensor] = s.offset;
    seen[i][s.tensor] = true;
  }
  // The blocks end where the last stage's tensors begin, or with the buffer.
  block_end = table.total_storage();
  for (const auto& s : table.specs())
    if (s.layer < 0 && s.offset > block_begin()) block_end = std::min(block_end, s.offset);
  // The table and the layout must describe the same stage.
  for (const auto& b : seen)
    for (bool k : b)
      if (!k) throw std::logic_error("StageLayout: a block tensor is missing from the table");
  if (range.has_embedding && (outer[outer::wte] < 0 || outer[outer::wpe] < 0))
    throw std::logic_error("StageLayout: the first stage has no embedding tables");
  if (range.has_head && (outer[outer::wte] < 0 || outer[outer::lnf_w] < 0))
    throw std::logic_error("StageLayout: the last stage has no head");
}

}  // namespace mpiformer
