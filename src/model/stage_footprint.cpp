#include "model/stage_footprint.hpp"

namespace mpiformer {

// Mirrors GptStage's constructor (gpt_stage_impl.hpp), buffer by buffer.
StageFootprint stage_footprint(const GptConfig& cfg, const StageRange& range, int64_t micro_batch,
                               int slots, size_t act_bytes, size_t acc_bytes) {
  const double act = static_cast<double>(act_bytes), acc = static_cast<double>(acc_bytes);
  const double B = static_cast<double>(micro_batch), T = static_cast<double>(cfg.seq_len);
  const double C = static_cast<double>(cfg.n_embd), NH = static_cast<double>(cfg.n_head);
  const double V = static_cast<double>(cfg.padded_vocab()), BT = B * T;
  const double L = static_cast<double>(range.num_layers());
  const double attention = B * NH * T * T;  // scores of every head
  // The deck's limits on the model's shapes keep this count in an int64;
  // the batch is not limited so, hence doubles for the activations.
  const double n = static_cast<double>(ParameterTable(cfg, range).total_storage());
  StageFootprint f;
  f.parameters = n * acc;
  f.gradients = n * acc;
  f.weight_copy = act_bytes != acc_bytes ? n * act : 0;
  // One slot: the residual stream at every block boundary, then per block
  // ln1, qkv, atty, res2, ln2 (1+3+1+1+1), fch and its GELU (4+4), the
  // attention probabilities, and 4 LayerNorm statistics.
  double slot = (L + 1) * BT * C * act + L * ((15 * BT * C + attention) * act + 4 * BT * acc);
  if (range.has_embedding) slot += BT * 4;  // token ids
  if (range.has_head) slot += (BT * C + BT * V) * act + 3 * BT * acc + BT * 4;  // lnf, logits, targets
  f.per_slot = slot;
  f.activations = slot * slots;
  // Backward scratch: dres, dln, datty; dqkv, d4 and datt with blocks; the
  // output gradient's inbox on a non-last stage; the loss sum (a double).
  f.scratch = 3 * BT * C * act + (L > 0 ? (7 * BT * C + attention) * act : 0) +
              (range.has_head ? 0 : BT * C * act) + 8;
  return f;
}

}  // namespace mpiformer
