// The shape of a decoder-only transformer: in core because the input deck
// (io) and the checkpoints (io) describe it as much as the model does. Two
// families share it (DESIGN 14): GPT-2, and the Llama-style decoder
// (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases).
// The family picks a schema (model/gpt_schema.hpp); the sizes below mean
// the same in both.
#pragma once
#include <cstdint>

namespace mpiformer {

enum class ModelFamily : uint8_t { kGpt2, kLlama };

struct GptConfig {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;
  int64_t seq_len = 0;     // maximum context (GPT-2: the size of the position table)
  int64_t vocab_size = 0;  // real tokens
  ModelFamily family = ModelFamily::kGpt2;
  // Llama's (GPT-2 has n_kv_head = n_head, ffn_hidden = 4 n_embd, a tied
  // head and LayerNorm's 1e-5). The deck resolves every default, so a
  // config read from a deck or a checkpoint carries the values themselves.
  int64_t n_kv_head = 0;        // key/value heads, dividing n_head (0: n_head)
  int64_t ffn_hidden = 0;       // the MLP's hidden width (0: 4 n_embd)
  double rope_theta = 10000.0;  // rotary base
  double norm_eps = 1e-5;       // RMSNorm's epsilon
  bool tie_embeddings = true;   // the LM head is the embedding
  // Mixture of Experts (both families; 0 experts: every MLP dense). Layer l
  // is sparse when l % moe_every == 0 (Megatron's layer frequency): its MLP
  // is `experts` copies of the family's MLP behind a softmax top-k router
  // (kernels/common/moe_routing.hpp). capacity_factor 0: nothing dropped.
  // aux_loss and router_z_loss weigh the load-balancing (Switch) and z
  // losses, summed over the sparse layers and added to the training loss.
  int64_t experts = 0;
  int64_t top_k = 2;
  int64_t moe_every = 1;
  double capacity_factor = 1.25;
  double aux_loss = 0.01;
  double router_z_loss = 0.0;

  bool llama() const { return family == ModelFamily::kLlama; }
  // The LM head and embedding are padded to a multiple of 128 rows per
  // tensor rank (tp ranks each hold padded_vocab(tp) / tp of them) so the
  // largest GEMM of the model has a friendly shape on every rank; the
  // padding is never visible outside the model (checkpoints and logits use
  // vocab_size).
  int64_t padded_vocab(int64_t tp = 1) const {
    const int64_t m = 128 * tp;
    return (vocab_size + m - 1) / m * m;
  }
  int64_t head_dim() const { return n_embd / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Channels of k (and of v): the kv heads side by side.
  int64_t kv_dim() const { return kv_heads() * head_dim(); }
  // Rows of the fused q, k, v projection.
  int64_t qkv_dim() const { return n_embd + 2 * kv_dim(); }
  // Under tensor parallelism over `tp` ranks the kv heads are cut into
  // kv_ways(tp) blocks: one per rank while they are at least tp, else one
  // per kv head, each then replicated on kv_share(tp) neighbouring tensor
  // ranks (Megatron's grouped-query rule; the deck requires that one of
  // n_kv_head and tp divides the other). The ranks sharing a head sum its
  // gradients, each having computed them from its own query heads only.
  int64_t kv_ways(int64_t tp) const { return tp < kv_heads() ? tp : kv_heads(); }
  int64_t kv_share(int64_t tp) const { return tp / kv_ways(tp); }
  bool kv_heads_split(int64_t tp) const { return kv_heads() % tp == 0 || tp % kv_heads() == 0; }
  // A tensor rank's kv heads and their channels, and its rows of the
  // fused projection.
  int64_t kv_heads_per_rank(int64_t tp) const { return kv_heads() / kv_ways(tp); }
  int64_t kv_dim_per_rank(int64_t tp) const { return kv_heads_per_rank(tp) * head_dim(); }
  int64_t qkv_dim_per_rank(int64_t tp) const { return n_embd / tp + 2 * kv_dim_per_rank(tp); }
  int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * n_embd; }
  // Outputs of the MLP's first projection: GELU's input, or SwiGLU's gate
  // and up halves.
  int64_t ffn_in() const { return llama() ? 2 * ffn() : ffn(); }
  bool moe() const { return experts > 0; }
  bool moe_layer(int64_t l) const { return experts > 0 && l % moe_every == 0; }
  int64_t moe_layers() const { return experts > 0 ? (n_layer + moe_every - 1) / moe_every : 0; }
  // Assignments each expert takes per sequence of T tokens: the fair share
  // T k / E times the factor, rounded up (0: no limit).
  int64_t expert_capacity(int64_t T) const {
    if (experts == 0 || capacity_factor <= 0) return 0;
    const double share = capacity_factor * static_cast<double>(T * top_k) / static_cast<double>(experts);
    const int64_t c = static_cast<int64_t>(share);
    return static_cast<double>(c) < share ? c + 1 : c;
  }
};

// Llama's default MLP width: 2/3 of 4 n_embd, rounded up to `multiple_of`.
inline int64_t llama_ffn_hidden(int64_t n_embd, int64_t multiple_of) {
  const int64_t h = 2 * 4 * n_embd / 3;
  return (h + multiple_of - 1) / multiple_of * multiple_of;
}

}  // namespace mpiformer
