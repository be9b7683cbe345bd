// The schema and everything generated from it: the parameter table's names,
// shapes and flags, the stage layout's offsets and the optimizer's chunk
// list, checked against GPT-2's tensor list written out here by hand.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "model/parameter_table.hpp"
#include "model/stage_layout.hpp"

namespace mpiformer::test {
namespace {

GptConfig config() {
  GptConfig c;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 8;
  c.seq_len = 5;
  c.vocab_size = 11;
  return c;
}

TEST(Schema, TableHoldsGpt2TensorsWithShapesAndFlags) {
  const GptConfig cfg = config();
  const ParameterTable t(cfg, StageRange{0, 3, true, true});
  const int64_t C = 8;
  // name -> {shape, decay}, GPT-2's checkpoint layout ([out, in] matrices).
  std::map<std::string, std::pair<std::vector<int64_t>, bool>> want = {
      {"wte", {{11, C}, true}}, {"wpe", {{5, C}, true}},
      {"ln_f.weight", {{C}, false}}, {"ln_f.bias", {{C}, false}}};
  for (int l = 0; l < 3; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    want[h + "ln_1.weight"] = {{C}, false};
    want[h + "ln_1.bias"] = {{C}, false};
    want[h + "attn.c_attn.weight"] = {{3 * C, C}, true};
    want[h + "attn.c_attn.bias"] = {{3 * C}, false};
    want[h + "attn.c_proj.weight"] = {{C, C}, true};
    want[h + "attn.c_proj.bias"] = {{C}, false};
    want[h + "ln_2.weight"] = {{C}, false};
    want[h + "ln_2.bias"] = {{C}, false};
    want[h + "mlp.c_fc.weight"] = {{4 * C, C}, true};
    want[h + "mlp.c_fc.bias"] = {{4 * C}, false};
    want[h + "mlp.c_proj.weight"] = {{C, 4 * C}, true};
    want[h + "mlp.c_proj.bias"] = {{C}, false};
  }
  ASSERT_EQ(t.specs().size(), want.size());
  for (const auto& s : t.specs()) {
    ASSERT_TRUE(want.count(s.name)) << s.name;
    EXPECT_EQ(s.shape, want[s.name].first) << s.name;
    EXPECT_EQ(s.decay, want[s.name].second) << s.name;
    // The structure is recorded, not parsed: the layer and schema row agree
    // with the name.
    if (s.layer >= 0) {
      EXPECT_EQ(s.name, "h." + std::to_string(s.layer) + "." + block_schema(cfg.family)[s.tensor].name);
    } else {
      EXPECT_EQ(s.name, outer_schema(cfg.family)[s.tensor].name);
    }
  }
  EXPECT_EQ(t.at("wte").storage, 128 * C);  // the padded vocabulary
  EXPECT_EQ(t.tied_embedding(), &t.at("wte"));
}

// Llama's tensors, written out by hand: grouped-query qkv (C + 2 kv rows),
// SwiGLU's fused gate and up (2 F rows), RMSNorm weights, no biases, no
// position table, an untied head on the last stage only.
GptConfig llama_config() {
  GptConfig c = config();
  c.n_head = 4;
  c.family = ModelFamily::kLlama;
  c.n_kv_head = 2;
  c.ffn_hidden = 12;
  c.tie_embeddings = false;
  return c;
}

TEST(Schema, TableHoldsLlamaTensorsWithShapesAndFlags) {
  const GptConfig cfg = llama_config();
  const ParameterTable t(cfg, StageRange{0, 3, true, true});
  const int64_t C = 8, K = 4, F = 12;
  std::map<std::string, std::pair<std::vector<int64_t>, bool>> want = {
      {"embed_tokens.weight", {{11, C}, true}},
      {"norm.weight", {{C}, false}},
      {"lm_head.weight", {{11, C}, true}}};
  for (int l = 0; l < 3; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    want[h + "input_layernorm.weight"] = {{C}, false};
    want[h + "self_attn.qkv_proj.weight"] = {{C + 2 * K, C}, true};
    want[h + "self_attn.o_proj.weight"] = {{C, C}, true};
    want[h + "post_attention_layernorm.weight"] = {{C}, false};
    want[h + "mlp.gate_up_proj.weight"] = {{2 * F, C}, true};
    want[h + "mlp.down_proj.weight"] = {{C, F}, true};
  }
  ASSERT_EQ(t.specs().size(), want.size());
  for (const auto& s : t.specs()) {
    ASSERT_TRUE(want.count(s.name)) << s.name;
    EXPECT_EQ(s.shape, want[s.name].first) << s.name;
    EXPECT_EQ(s.decay, want[s.name].second) << s.name;
  }
  EXPECT_EQ(t.tied_embedding(), nullptr);
  const StageLayout at(t, StageRange{0, 3, true, true});
  EXPECT_EQ(at.head(), t.at("lm_head.weight").offset);
  EXPECT_LT(at.at(outer::wpe), 0);
  EXPECT_EQ(at.block(static_cast<float*>(nullptr), 1)[block::qkv_b], nullptr);
  // Pipelined: the embedding on the first stage only, the head on the last.
  const ParameterTable last(cfg, partition_stage(cfg, 2, 3));
  EXPECT_EQ(last.find("embed_tokens.weight"), nullptr);
  EXPECT_NE(last.find("lm_head.weight"), nullptr);
  // Tied, the last stage holds the embedding again and no lm_head.
  GptConfig tied = cfg;
  tied.tie_embeddings = true;
  const ParameterTable tied_last(tied, partition_stage(tied, 2, 3));
  EXPECT_NE(tied_last.tied_embedding(), nullptr);
  EXPECT_EQ(tied_last.find("lm_head.weight"), nullptr);
}

// A Mixture of Experts over both: 3 experts in layers 0 and 2 (moe_every 2).
GptConfig moe(GptConfig c) {
  c.experts = 3;
  c.top_k = 2;
  c.moe_every = 2;
  return c;
}

TEST(Schema, LayoutAndChunksAgreeWithTheTableOnEveryStage) {
  for (const GptConfig& cfg : {config(), llama_config(), moe(config()), moe(llama_config())})
  for (int64_t st = 0; st < 3; ++st) {
    const StageRange r = partition_stage(cfg, st, 3);
    const ParameterTable t(cfg, r);
    const StageLayout at(t, r);
    for (int64_t i = 0; i < r.num_layers(); ++i) {
      const auto v = at.block(static_cast<float*>(nullptr), i);
      const int64_t layer = r.first_layer + i;
      const std::string h = "h." + std::to_string(layer) + ".";
      for (int k = 0; k < block::kCount; ++k) {
        const auto role = static_cast<block::Tensor>(k);
        const char* tail = block_schema(cfg.family)[k].name;
        // A dense block has no router; a sparse one has each expert's MLP
        // ("mlp.experts.<e>." and the rest of the dense name).
        if (tail == nullptr || (role == block::router_w && !cfg.moe_layer(layer))) {
          EXPECT_EQ(v[role], nullptr);
          continue;
        }
        if (cfg.moe_layer(layer) && block::is_expert_tensor(k)) {
          EXPECT_EQ(t.find(h + tail), nullptr) << h + tail;
          for (int64_t e = 0; e < cfg.experts; ++e) {
            const std::string name = h + "mlp.experts." + std::to_string(e) + "." + (tail + 4);
            EXPECT_EQ(v.expert(role, e) - static_cast<float*>(nullptr), t.at(name).offset) << name;
          }
          continue;
        }
        EXPECT_EQ(v[role] - static_cast<float*>(nullptr), t.at(h + tail).offset) << h + tail;
      }
    }
    // Sparse and dense blocks differ in size: each block's span ends where
    // the next begins, and a window holds the largest.
    for (int64_t i = 0; i < r.num_layers(); ++i) {
      EXPECT_LE(at.block_stop(i) - at.layers[static_cast<size_t>(i)][0], at.block_storage());
      EXPECT_EQ(at.block_at_offset(at.block_stop(i) - 1), i);
    }
    EXPECT_EQ(at.at(outer::wte) >= 0, r.has_embedding || (r.has_head && cfg.tie_embeddings));
    EXPECT_EQ(at.at(outer::lnf_w) >= 0, r.has_head);
    // The chunk list covers each tensor's logical elements exactly once,
    // with the table's decay flag, and never wte's padding.
    std::vector<int> covered(static_cast<size_t>(t.total_storage()), 0), decay(covered.size(), -1);
    for (const AdamWChunk& c : adamw_chunks(t))
      for (int64_t j = c.offset; j < c.offset + c.length; ++j) {
        ++covered[j];
        decay[j] = c.decay;
      }
    for (const auto& s : t.specs())
      for (int64_t j = 0; j < s.storage; ++j) {
        const bool logical = j < s.numel();
        ASSERT_EQ(covered[s.offset + j], logical ? 1 : 0) << s.name << "[" << j << "]";
        if (logical) {
          ASSERT_EQ(decay[s.offset + j], s.decay ? 1 : 0) << s.name;
        }
      }
  }
}

// Under tensor parallelism the slices of each split tensor tile the whole
// tensor: every logical element is in exactly one rank's boxes (a
// replicated tensor is each rank's whole, counted on rank 0), the boxes
// cover each slice's rows once, and every slice of a rank but wte's is as
// large as the others'.
TEST(Schema, TensorParallelSlicesTileEveryTensor) {
  GptConfig gpt2;
  gpt2.n_layer = 2;
  gpt2.n_head = 4;
  gpt2.n_embd = 8;
  gpt2.seq_len = 5;
  gpt2.vocab_size = 300;  // 2 x 256 or 4 x 128 padded rows: uneven real shares
  // Llama: q, k, v parts of unequal size (4 kv heads of 8), gate and up.
  GptConfig llama = gpt2;
  llama.n_head = 8;
  llama.n_embd = 16;
  llama.family = ModelFamily::kLlama;
  llama.n_kv_head = 4;
  llama.ffn_hidden = 12;
  llama.tie_embeddings = false;
  // And 2 kv heads over tp 4: each shared by two ranks, owned by the first.
  GptConfig shared = llama;
  shared.n_kv_head = 2;
  for (const GptConfig& cfg : {gpt2, llama, shared}) {
  const ParameterTable whole(cfg, StageRange{0, 2, true, true});
  for (int64_t tp : {2, 4}) {
    for (const auto& w : whole.specs()) {
      const int64_t width = w.shape.size() > 1 ? w.shape[1] : 1;
      std::vector<int> seen(static_cast<size_t>(w.numel()), 0);
      for (int64_t r = 0; r < tp; ++r) {
        const ParameterTable t(cfg, StageRange{0, 2, true, true, tp, r});
        const ParameterSpec& s = t.at(w.name);
        EXPECT_EQ(s.logical_shape, w.shape) << w.name;
        EXPECT_EQ(s.whole(), s.schema().split == Split::kNone) << w.name;
        if (s.whole() && r > 0) continue;
        int64_t rows = 0;
        for (const LogicalBox& b : s.boxes(0, s.shape[0])) {
          EXPECT_EQ(b.local_row, rows) << w.name;
          EXPECT_EQ(b.cols, s.row_length()) << w.name;
          rows += b.rows;
        }
        EXPECT_EQ(rows, s.shape[0]) << w.name;
        for (const LogicalBox& b : s.owned_boxes(0, s.shape[0]))
          for (int64_t i = 0; i < b.rows; ++i)
            for (int64_t c = 0; c < b.cols; ++c) ++seen[(b.row + i) * width + b.col + c];
      }
      for (size_t e = 0; e < seen.size(); ++e) ASSERT_EQ(seen[e], 1) << w.name << "[" << e << "], tp " << tp;
    }
  }
  }
}

// Fewer kv heads than tensor ranks (Megatron's rule for grouped-query
// attention): rank r holds the r-th block of query heads and kv head
// r / share whole, share = tp / n_kv_head; written out by hand for 8 query
// heads of 2 channels over 2 kv heads.
TEST(Schema, KvHeadsFewerThanTensorRanksAreSharedByNeighbours) {
  GptConfig cfg;
  cfg.family = ModelFamily::kLlama;
  cfg.n_layer = 1;
  cfg.n_head = 8;
  cfg.n_embd = 16;
  cfg.seq_len = 4;
  cfg.vocab_size = 50;
  cfg.n_kv_head = 2;
  cfg.ffn_hidden = 16;
  cfg.tie_embeddings = false;
  const int64_t C = 16, hd = 2, K = 4;  // K: the kv channels
  for (int64_t tp : {4, 8}) {
    const int64_t share = tp / 2;
    EXPECT_EQ(cfg.kv_share(tp), share);
    for (int64_t r = 0; r < tp; ++r) {
      const ParameterTable t(cfg, StageRange{0, 1, true, true, tp, r});
      const ParameterSpec& s = t.at("h.0.self_attn.qkv_proj.weight");
      const int64_t q = C / tp;
      ASSERT_EQ(s.shape, (std::vector<int64_t>{q + 2 * hd, C}));
      const std::vector<LogicalBox> b = s.boxes(0, s.shape[0]);
      ASSERT_EQ(b.size(), 3u);
      EXPECT_EQ(b[0].row, r * q);                    // its query heads
      EXPECT_EQ(b[1].row, C + r / share * hd);       // k of kv head r / share
      EXPECT_EQ(b[2].row, C + K + r / share * hd);   // and its v
      EXPECT_EQ(b[1].rows, hd);
      EXPECT_EQ(b[2].local_row, q + hd);
      EXPECT_EQ(s.shared_rows().begin, q);
      EXPECT_EQ(s.shared_rows().end, q + 2 * hd);
      EXPECT_EQ(s.share(), share);
      EXPECT_EQ(s.owns_shared(), r % share == 0);
      // Owned: the first of the sharers writes k and v; the others q only.
      EXPECT_EQ(s.owned_boxes(0, s.shape[0]).size(), r % share == 0 ? 3u : 1u);
      // A ZeRO part's rows clip the shared ones.
      EXPECT_EQ(s.shared_rows_in(q + 1, q + 3).begin, q + 1);
      EXPECT_EQ(s.shared_rows_in(0, q).end - s.shared_rows_in(0, q).begin, 0);
      // The other split tensors as without sharing; no other has shared rows.
      for (const auto& spec : t.specs()) {
        if (&spec == &s) continue;
        EXPECT_EQ(spec.share(), 1) << spec.name;
      }
    }
  }
  EXPECT_FALSE(cfg.kv_heads_split(3));
  EXPECT_TRUE(cfg.kv_heads_split(1));
}

}  // namespace
}  // namespace mpiformer::test
