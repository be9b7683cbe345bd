#include "train/initial_weights.hpp"

#include <cmath>
#include <algorithm>
#include <map>
#include <set>
#include <memory>
#include <vector>

#include "core/error.hpp"
#include "core/format.hpp"
#include "model/gpt2_formats.hpp"
#include "model/llama_formats.hpp"
#include "parallel/input_agreement.hpp"
#include "train/checkpointing.hpp"
#include "weight_source.hpp"

namespace mpiformer {
namespace {

// Rows [row, row + rows) of one of our tensors, as the file stores them
// (a whole foreign tensor: Llama's q, k, v are parts of our fused qkv).
struct ForeignPiece {
  ForeignTensor t;
  int64_t row = 0, rows = 0;
};

// Every tensor of the whole model as the file stores it.
std::map<std::string, std::vector<ForeignPiece>> foreign_tensors(const WeightsShape& w,
                                                                 const WeightSource& src,
                                                                 const ParameterTable& whole) {
  std::map<std::string, std::vector<ForeignPiece>> out;
  if (w.format == WeightFormat::kHuggingFace && w.cfg.llama()) {
    for (const auto& s : whole.specs())
      for (const HfPart& p : hf_llama_parts(s)) {
        std::vector<int64_t> shape = s.shape;
        shape[0] = p.rows;
        out[s.name].push_back({ForeignTensor{p.name, 0, shape, false}, p.row, p.rows});
      }
    // Every tensor of the files is one the model reads: an extra one is a
    // model of another shape (or family), not something to skip silently.
    std::set<std::string> known;
    for (const auto& [name, pieces] : out)
      for (const ForeignPiece& p : pieces) known.insert(p.t.name);
    for (const std::string& name : src.names())
      if (known.count(name) == 0)
        throw InputError(w.file, name, "a tensor this Llama model does not have (extra)");
    return out;
  }
  if (w.format == WeightFormat::kHuggingFace) {
    for (const auto& s : whole.specs()) {
      ForeignTensor t{hf_name(s), 0, s.shape, hf_transposed(s)};
      if (t.transposed) std::swap(t.shape[0], t.shape[1]);
      out[s.name].push_back({t, 0, s.shape[0]});
    }
    return out;
  }
  int64_t at = 0;  // llm.c: back to back in its order, wte with its padded rows
  for (const ParameterSpec* s : llmc_order(whole)) {
    ForeignTensor t{s->name, at, s->shape, false};
    if (s->layer < 0 && s->tensor == outer::wte) t.shape[0] = src.padded_vocab();
    at += t.shape[0] * (t.shape.size() > 1 ? t.shape[1] : 1);
    out[s->name].push_back({t, 0, s->shape[0]});
  }
  return out;
}

// This rank's rows of a tensor's slice, and where they are in the flat
// parameter buffer (its ZeRO shard when there is a plan).
struct LocalRows {
  int64_t row_begin, row_end;
  float* dst;
};
LocalRows local_rows(const ParameterSpec& spec, const ShardPlan* plan, float* params) {
  if (plan == nullptr) return {0, spec.shape[0], params + spec.offset};
  const TensorPart p = plan->part_of(spec);
  return {p.row_begin, p.row_end, params + p.shard_offset};
}

}  // namespace

std::string load_initial_weights(const Deck& deck, StageBackend& stage, ProcessGrid& grid) {
  const GptConfig& cfg = deck.model;
  const ParameterTable& local = stage.table();
  const ShardPlan* plan = stage.shard_plan();
  std::vector<float> params(static_cast<size_t>(stage.state_size()), 0.0f);
  WeightsShape w;
  std::string digest;
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    w = read_weights_shape(deck.model_init);
    digest = weights_digest(w);
  });
  // Each rank reads its own slices: of one file, not of a copy that differs.
  agree_on_view(MPI_COMM_WORLD, digest, w.file, "[model] init");
  if (w.format == WeightFormat::kCheckpoint) {
    std::unique_ptr<CheckpointReader> reader;
    agree_on_input_errors(MPI_COMM_WORLD, [&] { reader = std::make_unique<CheckpointReader>(w.file); });
    agree_on_input_errors(MPI_COMM_WORLD, [&] {
      const StageState state{params.data(), nullptr, nullptr, plan};
      if (plan != nullptr) restore_shard(*reader, cfg, local, state, read_groups(grid));
      else restore_whole_stage(*reader, cfg, local, stage.range(), state, read_groups(grid));
    });
  } else {
    agree_on_input_errors(MPI_COMM_WORLD, [&] {
      const auto src = open_weight_source(w);
      if (w.format == WeightFormat::kLlmc && src->padded_vocab() < cfg.vocab_size) {
        throw InputError(w.file, "header padded vocabulary", "smaller than the vocabulary");
      }
      const ParameterTable whole(cfg, StageRange{0, cfg.n_layer, true, true});
      const auto foreign = foreign_tensors(w, *src, whole);
      for (const auto& spec : local.specs()) {
        const LocalRows r = local_rows(spec, plan, params.data());
        for (const LogicalBox& b : spec.boxes(r.row_begin, r.row_end))
          for (const ForeignPiece& p : foreign.at(spec.name)) {
            // The box's rows within this piece, read from the piece's tensor.
            const int64_t r0 = std::max(b.row, p.row), r1 = std::min(b.row + b.rows, p.row + p.rows);
            if (r0 >= r1) continue;
            src->read(p.t, DatasetBox{r0 - p.row, r1 - r0, b.col, b.cols},
                      r.dst + (b.local_row + (r0 - b.row) - r.row_begin) * b.cols);
          }
      }
    });
  }
  // Weights that are not finite would be skipped step after step (with
  // [train] nonfinite = "skip") or stop the first: name the tensor now.
  agree_on_input_errors(MPI_COMM_WORLD, [&] {
    for (const auto& spec : local.specs()) {
      const LocalRows r = local_rows(spec, plan, params.data());
      const int64_t cols = spec.row_length();
      const float* x = r.dst;
      for (int64_t i = 0; i < (r.row_end - r.row_begin) * cols; ++i) {
        if (!std::isfinite(x[i])) {
          throw InputError(w.file, "tensor " + spec.name,
                           strprintf("holds %s (row %lld of this rank's rows): pretrained "
                                     "weights must be finite",
                                     std::isnan(x[i]) ? "NaN" : "an infinity",
                                     static_cast<long long>(r.row_begin + i / cols)));
        }
      }
    }
  });
  stage.load_state(params.data(), nullptr, nullptr);
  const char* what = w.format == WeightFormat::kHuggingFace ? "Hugging Face safetensors"
                     : w.format == WeightFormat::kLlmc      ? "llm.c parameter file"
                                                            : "mpiformer checkpoint (weights only)";
  return strprintf("init: weights from %s (%s%s%s), each rank reading its own slices; AdamW "
                   "moments at zero, data from the start",
                   w.file.c_str(), what, w.note.empty() ? "" : "; ", w.note.c_str());
}

}  // namespace mpiformer
