#include "model/parameter_table.hpp"

#include "model/stage_layout.hpp"
#include "core/layer_chunks.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace mpiformer {

StageRange partition_stage(const GptConfig& cfg, int64_t stage, int64_t num_stages, int64_t tp,
                           int64_t tp_rank, int64_t chunks) {
  StageRange r;
  if (chunks > 1) {
    const LayerChunks cut = layer_chunks(cfg.n_layer, num_stages, chunks);
    if (!cut.refusal.empty()) throw std::logic_error("partition_stage: " + cut.refusal);
    // Chunk c of stage s, the model's (c pp + s)-th, starts where a full
    // one would less the first chunk's shortfall.
    r.first_short = stage == 0 ? cut.first_short : 0;
    r.last_short = stage == num_stages - 1 ? cut.last_short : 0;
    r.first_layer = stage * cut.full - cut.first_short + r.first_short;
    r.last_layer = stage * cut.full - cut.first_short + cut.full;
    r.chunks = chunks;
    r.chunk_stride = num_stages * cut.full;
  } else {
    const int64_t base = cfg.n_layer / num_stages, extra = cfg.n_layer % num_stages;
    r.first_layer = stage * base + std::min(stage, extra);
    r.last_layer = r.first_layer + base + (stage < extra ? 1 : 0);
  }
  r.has_embedding = stage == 0;
  r.has_head = stage == num_stages - 1;
  r.tp = tp;
  r.tp_rank = tp_rank;
  return r;
}

int64_t ParameterSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ParameterSpec::row_length() const { return shape.size() > 1 ? shape[1] : 1; }

int64_t ParameterSpec::logical_numel() const {
  int64_t n = 1;
  for (int64_t d : logical_shape) n *= d;
  return n;
}

int64_t ParameterSpec::vocab_begin() const { return split == Split::kRows ? tp_rank * (storage / row_length()) : 0; }

std::vector<LogicalBox> ParameterSpec::boxes(int64_t row_begin, int64_t row_end) const {
  const int64_t rl = row_length();
  std::vector<LogicalBox> out;
  if (row_end <= row_begin) return out;
  switch (split) {
    case Split::kNone:
      out.push_back({row_begin, row_end - row_begin, 0, rl, row_begin});
      break;
    case Split::kRows: {
      // Rank r's rows start at r times the slice's stored rows (wte: the
      // padded vocabulary's share; elsewhere rows / tp).
      const int64_t first = tp_rank * (storage / rl);
      out.push_back({first + row_begin, row_end - row_begin, 0, rl, row_begin});
      break;
    }
    case Split::kCols:
      out.push_back({row_begin, row_end - row_begin, tp_rank * rl, rl, row_begin});
      break;
    case Split::kHeads: {
      // The slice is this rank's block of each part, in part order; each
      // goes to its own place in its part of the whole tensor. A part cut
      // into fewer blocks than tp: block tp_rank / (tp / ways).
      int64_t local = 0, whole = 0;
      for (size_t k = 0; k < parts.size(); ++k) {
        const int64_t ways = part_ways[k], mine = parts[k] / ways;
        const int64_t block = tp_rank / (tp / ways);
        const int64_t b = std::max(row_begin, local), e = std::min(row_end, local + mine);
        if (b < e) out.push_back({whole + block * mine + (b - local), e - b, 0, rl, b});
        local += mine;
        whole += parts[k];
      }
      break;
    }
  }
  return out;
}

ParameterSpec::Rows ParameterSpec::shared_rows() const {
  Rows r;
  if (split != Split::kHeads) return r;
  int64_t local = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const int64_t mine = parts[k] / part_ways[k];
    if (part_ways[k] < tp) {
      // The replicated parts are adjacent (k and v): one range.
      if (r.end > r.begin && r.end != local)
        throw std::logic_error("ParameterSpec: replicated parts of " + name + " not adjacent");
      if (r.end == r.begin) r.begin = local;
      r.end = local + mine;
    }
    local += mine;
  }
  return r;
}

int64_t ParameterSpec::share() const {
  for (size_t k = 0; k < parts.size(); ++k)
    if (split == Split::kHeads && part_ways[k] < tp) return tp / part_ways[k];
  return 1;
}

std::vector<LogicalBox> ParameterSpec::owned_boxes(int64_t row_begin, int64_t row_end) const {
  const Rows shared = shared_rows();
  if (shared.end == shared.begin || owns_shared()) return boxes(row_begin, row_end);
  std::vector<LogicalBox> out = boxes(row_begin, std::min(row_end, shared.begin));
  for (const LogicalBox& b : boxes(std::max(row_begin, shared.end), row_end)) out.push_back(b);
  return out;
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
    case Extent::kKv:
      return e.times * cfg.kv_dim();
    case Extent::kQkv:
      return e.times * cfg.qkv_dim();
    case Extent::kFfn:
      return e.times * cfg.ffn();
    case Extent::kExperts:
      return e.times * cfg.experts;
  }
  return 0;
}

}  // namespace

void ParameterTable::add(const GptConfig& cfg, const StageRange& range, const TensorSchema& schema,
                         std::string name, int64_t layer, int tensor) {
  ParameterSpec s;
  s.name = std::move(name);
  s.logical_shape = {resolve(schema.rows, cfg)};
  if (schema.cols.times > 0) s.logical_shape.push_back(resolve(schema.cols, cfg));
  s.shape = s.logical_shape;
  s.tp = range.tp;
  s.tp_rank = range.tp_rank;
  s.split = range.tp > 1 ? schema.split : Split::kNone;
  int64_t kheads_rows = 0;  // kHeads: this rank's rows, a block of each part
  if (schema.split == Split::kHeads) {
    int64_t sum = 0;
    for (const Extent& e : schema.parts)
      if (e.times > 0) {
        // The kv heads' parts are cut by heads (GptConfig::kv_ways).
        const int64_t ways = e.size == Extent::kKv ? cfg.kv_ways(range.tp) : range.tp;
        s.parts.push_back(resolve(e, cfg));
        s.part_ways.push_back(ways);
        sum += s.parts.back();
        kheads_rows += s.parts.back() / ways;
        if (s.parts.back() % ways != 0 || range.tp % ways != 0)
          throw std::logic_error("ParameterTable: a part of " + s.name + " does not split over tp");
      }
    if (sum != s.logical_shape[0])
      throw std::logic_error("ParameterTable: the parts of " + s.name + " are not its rows");
  }
  const bool vocab = schema.rows.size == Extent::kVocab;
  // Rows of the stored slice (wte: its share of the padded vocabulary).
  int64_t stored_rows = s.shape[0];
  switch (s.split) {
    case Split::kNone:
      if (vocab) stored_rows = cfg.padded_vocab();
      break;
    case Split::kRows:
      if (vocab) {
        // The padded vocabulary is split evenly; the real tokens fill the
        // first ranks' shares (the last ones may hold padding only).
        stored_rows = cfg.padded_vocab(range.tp) / range.tp;
        s.shape[0] = std::clamp(cfg.vocab_size - range.tp_rank * stored_rows, int64_t{0}, stored_rows);
      } else {
        stored_rows = s.shape[0] = s.shape[0] / range.tp;
      }
      break;
    case Split::kHeads:
      stored_rows = s.shape[0] = kheads_rows;
      break;
    case Split::kCols:
      s.shape[1] /= range.tp;
      break;
  }
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
  s.row = &schema;
  // The vocabulary is padded in storage (GptConfig::padded_vocab); the padded
  // rows stay zero for ever.
  s.storage = stored_rows * s.row_length();
  // Keep every tensor 16-element aligned so vector loads never straddle two.
  s.offset = total_;
  total_ += (s.storage + 15) / 16 * 16;
  specs_.push_back(std::move(s));
}

ParameterTable::ParameterTable(const GptConfig& cfg, const StageRange& range) {
  const TensorSchema* outer_rows = outer_schema(cfg.family);
  const TensorSchema* block_rows = block_schema(cfg.family);
  // Buffer order: the first stage's tensors (a tied wte also on the last
  // stage, where it is the LM head), the blocks, the last stage's tensors
  // (an untied LM head among them).
  for (int k = 0; k < outer::kCount; ++k) {
    const TensorSchema& t = outer_rows[k];
    if (t.name != nullptr && t.placement == Placement::kFirstStage &&
        (range.has_embedding || (k == outer::wte && cfg.tie_embeddings && range.has_head)))
      add(cfg, range, t, t.name, -1, k);
  }
  for (int64_t i = 0; i < range.num_layers(); ++i) {
    const int64_t l = range.layer(i);
    const bool sparse = cfg.moe_layer(l);
    const std::string h = "h." + std::to_string(l) + ".";
    for (int k = 0; k < block::kCount; ++k) {
      const TensorSchema& t = block_rows[k];
      if (t.name == nullptr || (k == block::router_w && !sparse)) continue;
      if (!sparse || !block::is_expert_tensor(k)) {
        add(cfg, range, t, h + t.name, l, k);
        continue;
      }
      // The dense name "mlp.<rest>" becomes "mlp.experts.<e>.<rest>"; the
      // rank's own experts only.
      const std::string rest = std::string(t.name).substr(std::string("mlp.").size());
      const int64_t local = cfg.experts / range.ep;
      for (int64_t j = 0; j < local; ++j) {
        const int64_t e = range.ep_rank * local + j;
        add(cfg, range, t, h + "mlp.experts." + std::to_string(e) + "." + rest, l, k);
        specs_.back().expert = e;
        specs_.back().local_expert = j;
      }
    }
  }
  for (int k = 0; k < outer::kCount; ++k) {
    const TensorSchema& t = outer_rows[k];
    if (t.name != nullptr && t.placement == Placement::kLastStage && range.has_head &&
        (k != outer::lm_head || !cfg.tie_embeddings))
      add(cfg, range, t, t.name, -1, k);
  }
  if (cfg.tie_embeddings)
    for (size_t i = 0; i < specs_.size(); ++i)
      if (specs_[i].layer < 0 && specs_[i].tensor == outer::wte) tied_ = static_cast<int64_t>(i);
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
    : layers(static_cast<size_t>(range.num_layers())), steps(layers.size()) {
  outer.fill(-1);
  for (auto& l : layers) l.fill(-1);
  for (auto& l : steps) l.fill(0);
  for (const auto& s : table.specs()) {
    if (s.layer < 0) {
      outer[s.tensor] = s.offset;
      continue;
    }
    const int64_t block = range.block_of(s.layer);
    if (block < 0) throw std::logic_error("StageLayout: a layer the stage does not hold");
    const size_t b = static_cast<size_t>(block);
    // An expert's tensor: the rank's first expert's is the block's, the
    // others a step apart.
    const int64_t e = s.local_expert;
    if (e <= 0) layers[b][s.tensor] = s.offset;
    if (e == 1) steps[b][s.tensor] = s.offset - layers[b][s.tensor];
    if (e > 0 && s.offset != layers[b][s.tensor] + e * steps[b][s.tensor])
      throw std::logic_error("StageLayout: the experts of " + s.name + " are not evenly spaced");
  }
  // The blocks end where the last stage's tensors begin, or with the buffer.
  block_end = table.total_storage();
  for (const auto& s : table.specs())
    if (s.layer < 0 && s.offset > block_begin()) block_end = std::min(block_end, s.offset);
  // The table and the layout must describe the same stage: every block has
  // the family's tensors (the first, which its windows start at, always;
  // the router in the sparse blocks only).
  for (const auto& b : layers)
    for (int k = 0; k < block::kCount; ++k)
      if ((k != block::router_w && (b[k] >= 0) != (layers.front()[k] >= 0)) || b[0] < 0)
        throw std::logic_error("StageLayout: a block tensor is missing from the table");
  if (range.has_embedding && outer[outer::wte] < 0)
    throw std::logic_error("StageLayout: the first stage has no embedding table");
  if (range.has_head && (head() < 0 || outer[outer::lnf_w] < 0))
    throw std::logic_error("StageLayout: the last stage has no head");
  // The vocabulary's spans: each tensor up to the next one (or the end).
  const auto span_of = [&](int64_t begin) {
    Span sp{begin, table.total_storage()};
    for (const auto& s : table.specs()) {
      if (s.offset > begin) sp.end = std::min(sp.end, s.offset);
      if (s.offset == begin) {
        sp.row = s.row_length();
        sp.rows = s.storage / sp.row;
      }
    }
    return sp;
  };
  if (range.has_embedding) vocab_in = span_of(outer[outer::wte]);
  if (range.has_head) vocab_out = span_of(head());
}

}  // namespace mpiformer
