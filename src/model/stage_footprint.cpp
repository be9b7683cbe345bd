#include "model/stage_footprint.hpp"

#include <algorithm>

#include "model/moe_plan.hpp"
#include "model/stage_layout.hpp"

namespace mpiformer {

// Mirrors GptStage's constructor (gpt_stage_impl.hpp), buffer by buffer.
StageFootprint stage_footprint(const GptConfig& cfg, const StageRange& range,
                               const StageOptions& o, size_t act_bytes, size_t acc_bytes,
                               AttentionStorage storage) {
  const ParameterTable table(cfg, range);
  return stage_footprint(cfg, range, table, StageLayout(table, range), o, act_bytes, acc_bytes, storage);
}

StageFootprint stage_footprint(const GptConfig& cfg, const StageRange& range,
                               const ParameterTable& table, const StageLayout& layout,
                               const StageOptions& o, size_t act_bytes, size_t acc_bytes,
                               AttentionStorage storage) {
  const double act = static_cast<double>(act_bytes), acc = static_cast<double>(acc_bytes);
  // T: the tokens of each sequence this rank holds (its cp-th).
  const double B = static_cast<double>(o.micro_batch),
               T = static_cast<double>(cfg.seq_len) / static_cast<double>(std::max<int64_t>(o.cp, 1));
  storage = stage_attention_storage(storage, o.cp);
  // Under tensor parallelism: this rank's heads, attention and MLP
  // channels, and share of the padded vocabulary.
  const double tp = static_cast<double>(range.tp);
  const double C = static_cast<double>(cfg.n_embd), NH = static_cast<double>(cfg.n_head) / tp;
  const double Ca = C / tp, Cqkv = static_cast<double>(cfg.qkv_dim_per_rank(range.tp));
  const double Cm = static_cast<double>(cfg.ffn()) / tp, Cin = static_cast<double>(cfg.ffn_in()) / tp;
  // Norm statistics per row: LayerNorm's mean and rstd, RMSNorm's rstd.
  const double stats = cfg.llama() ? 1 : 2;
  const double V = static_cast<double>(cfg.padded_vocab(range.tp)) / tp, BT = B * T;
  // The residual stream's rows this rank holds (a tp-th of them under
  // sequence parallelism).
  const double R = o.sequence_parallel ? BT / tp : BT;
  // A slot holds one chunk (the stage's every layer without interleaving),
  // as many layers as a chunk that lacks none.
  const double L = static_cast<double>(range.full_chunk());
  // Attention's kept state, and its backward's scratch, in bytes (the
  // plan keeps both in the statistics type, float, on every device).
  const double attention = attention_state_elements(storage, B, NH, T) * acc;
  const double attention_scratch =
      o.cp > 1 ? 0.0
               : attention_scratch_elements(storage, B, NH, T, static_cast<double>(cfg.head_dim())) * acc;
  // The deck's limits on the model's shapes keep this count in an int64;
  // the batch is not limited so, hence doubles for the activations.
  const double n = static_cast<double>(table.total_storage());
  const double window = static_cast<double>(layout.block_storage());
  // What stays outside the windows (GptStage::resident_weight_offset,
  // resident_grad_offset): the vocabulary's weights at zero 3, its
  // gradients from zero 2 (GptStage's vocab_*_windowed).
  const bool vocab_weights = layout.windows_vocab(o.window_weights);
  const bool vocab = layout.windows_vocab(o.window_weights || o.window_vocab_grads);
  const auto resident = [&](bool windowed, bool vocab_windowed) {
    const int64_t kept = layout.resident_offset(table.total_storage(), windowed, vocab_windowed);
    return static_cast<double>(kept) + (windowed ? 2 * window : 0);
  };
  StageFootprint f;
  f.parameters = o.external_master ? 0 : n * acc;
  f.gradients = resident(o.window_grads, vocab) * acc;
  if (act_bytes != acc_bytes || o.external_master)
    f.weight_copy = resident(o.window_weights, vocab_weights) * act;
  // What one block keeps for backward: ln1, res2, ln2 (C each, on the rows
  // held), qkv and atty (the fused projection's and the query channels),
  // fch and its activation (the MLP's first projection's and hidden
  // channels), the two norms' statistics (rows held), and attention's
  // state (probabilities or row statistics) unless recomputed.
  //
  // A sparse block (moe_plan.hpp) keeps its MLP's two for the rows its
  // experts compute Mr instead (a slot position serving dense and sparse
  // blocks: the more rows), the outputs y of its tokens' M dispatched
  // rows, and the router's decisions: probs, lse, gates (acc), experts,
  // places (int32) per token, the counts per sequence (int32) and kept
  // rows per expert (int64); under expert parallelism the received rows,
  // and under split backward their output gradients too (left for W).
  const MoePlan moe = moe_plan(cfg, range, o.micro_batch, std::max<int64_t>(o.cp, 1));
  const double M = static_cast<double>(moe.rows), E = static_cast<double>(cfg.experts);
  const double Mr = static_cast<double>(moe.received);
  const double K = static_cast<double>(cfg.top_k);
  const auto kept_at = [&](bool dense, bool sparse) {
    const double mlp_rows = std::max(dense ? BT : 0.0, sparse ? Mr : 0.0);
    double k = 3 * C * R * act + (Cqkv + Ca) * BT * act + (Cin + Cm) * mlp_rows * act +
               2 * stats * R * acc;
    if (sparse) k += M * C * act + (BT * E + BT + BT * K) * acc + 2 * BT * K * 4 + B * E * 4 + E * 8;
    if (sparse && moe.ep > 1) k += (o.split_backward ? 2 : 1) * Mr * C * act;
    return k;
  };
  bool any_dense = false;
  for (bool d : moe.dense_at) any_dense = any_dense || d;
  const double block_kept = kept_at(any_dense, moe.any_sparse);  // recomputation's one set
  // The head's: lnf, logits; lnf's statistics, the losses; targets (split
  // backward, interleaving: one set for every slot).
  const double head = range.has_head ? (R * C + BT * V) * act + (stats * R + BT) * acc + BT * 4 : 0;
  const bool shared_head = o.split_backward || range.chunks > 1;
  // One slot, of the positions [lo, hi) it holds (StageRange::slot_span):
  // the residual stream at their block boundaries, then per block what it
  // keeps (nothing under full recomputation).
  const auto slot_bytes = [&](std::pair<int64_t, int64_t> span) {
    double slot = static_cast<double>(span.second - span.first + 1) * R * C * act;
    for (int64_t j = span.first; j < span.second; ++j) {
      const size_t u = static_cast<size_t>(j);
      const double kept = kept_at(moe.dense_at[u], moe.sparse_at[u]);
      if (o.recompute == Recompute::kNone) slot += kept + attention;
      if (o.recompute == Recompute::kAttention) slot += kept;
    }
    if (range.has_embedding) slot += BT * 4;  // token ids
    if (o.positions_given()) slot += BT * 4;  // their positions (in documents, or the sequence)
    if (!shared_head) slot += head;
    // Split backward: the blocks' LayerNorm weight gradients B leaves for W.
    if (o.split_backward) slot += 4 * L * C * acc;
    return slot;
  };
  // A whole chunk's; each slot's as the schedule has it (SlotKinds).
  f.per_slot = slot_bytes(range.slot_span(false, false));
  const SlotKinds& k = o.slots;
  f.activations = k.both * slot_bytes(range.slot_span(true, true)) +
                  k.first * slot_bytes(range.slot_span(true, false)) +
                  k.last * slot_bytes(range.slot_span(false, true)) +
                  (k.count - k.both - k.first - k.last) * f.per_slot;
  // Backward scratch: dres (rows held), dln, datty; dqkv, d4 and attention's
  // backward scratch with
  // blocks (Llama: SwiGLU's output gradient, and the rotary table); the output gradient's inbox on a non-last stage; the loss sum
  // (a double); the vocabulary-parallel cross-entropy's row statistics (3
  // per row); recomputation's shared probabilities, or one block's
  // activations and output; sequence parallelism's gathered rows, summed
  // input gradient rows and 4 LayerNorm weight gradients; the one set of
  // head buffers where it is shared. Interleaved, the last stage's earlier
  // chunks receive output gradients too.
  f.scratch = R * C * act + (C + Ca) * BT * act +
              (L > 0 ? (Cqkv + Cin) * BT * act + attention_scratch : 0) +
              (range.has_head && range.chunks == 1 ? 0 : R * C * act) + 8;
  if (range.has_head && range.tp > 1) f.scratch += 3 * BT * acc;
  // The head's input gradient summed over its vocabulary pieces in float.
  if (range.has_head && vocab && layout.vocab_pieces(StageLayout::kVocabOut) > 1)
    f.scratch += BT * C * acc;
  if (L > 0 && cfg.llama())
    f.scratch += Cm * BT * act + static_cast<double>(cfg.seq_len * cfg.head_dim()) * sizeof(float);
  if (L > 0 && o.recompute == Recompute::kAttention) f.scratch += attention;
  if (L > 0 && o.recompute == Recompute::kFull) f.scratch += block_kept + attention + R * C * act;
  if (o.sequence_parallel) f.scratch += (BT * C + R * C) * act + 4 * C * acc;
  // The embedding gathered by token rows (tp > 1 without sequence
  // parallelism): the gathered rows and the positions' order.
  if (range.tp > 1 && range.has_embedding && !o.sequence_parallel) f.scratch += BT * C * act + BT * 4;
  if (shared_head) f.scratch += head;
  // A Mixture of Experts' shared buffers: the router's logits (act and
  // acc), the gates' gradients, two sets of dispatched rows, the experts'
  // hidden gradient (Llama: and SwiGLU's output's), the router's scratch
  // and two sets of totals; under expert parallelism the received rows'
  // outputs and gradients.
  if (moe.any_sparse) {
    f.scratch += BT * E * (act + acc) + BT * K * acc + (2 * M * C + Mr * Cin) * act +
                 (cfg.llama() ? Mr * Cm * act : 0) +
                 static_cast<double>(router_scratch_words(moe.router)) * 8 + 2 * kRouterTotals * 8;
    if (moe.ep > 1) f.scratch += Mr * C * act;
  }
  return f;
}

}  // namespace mpiformer
