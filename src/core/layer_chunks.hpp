// How interleaving cuts a model's layers into pp x v chunks: the one rule
// the deck checks, the stage partition follows and the planner searches.
#pragma once
#include <cstdint>
#include <string>

namespace mpiformer {

// Every chunk holds `full` layers but the model's first (the embedding's,
// on stage 0) and its last (the head's, on stage pp - 1), which lack
// `first_short` and `last_short` of them. Meta's Llama 3 405B takes one
// layer off each (126 layers on 16 stages: 8 a stage, 7 on the first and
// on the last) because the embedding and the head weigh on those two
// stages; Megatron's first/last stage layer counts do the same by hand.
struct LayerChunks {
  int64_t full = 0, first_short = 0, last_short = 0;
  // Empty when n_layer cuts so; otherwise why it does not.
  std::string refusal;
};

// n_layer layers into pp x v chunks: as many in each as the largest needs
// (the round-up of n_layer / (pp v)); the chunks' excess taken off the
// last chunk (the head, the heavier end) then the first, half each
// (the last the odd one). Every chunk keeps at least one layer.
inline LayerChunks layer_chunks(int64_t n_layer, int64_t pp, int64_t v) {
  LayerChunks c;
  const int64_t n = pp * v;
  if (n <= 0 || n_layer < n) {
    c.refusal = "fewer layers than chunks";
    return c;
  }
  c.full = (n_layer + n - 1) / n;
  const int64_t excess = n * c.full - n_layer;
  c.first_short = excess / 2;
  c.last_short = excess - c.first_short;
  if (c.last_short >= c.full)
    c.refusal = "the first and last chunks would be left without a layer";
  return c;
}

}  // namespace mpiformer
