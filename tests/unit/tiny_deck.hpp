// A deck of a tiny model that any back end builds a stage of in
// milliseconds: for tests that need a real stage (unit and GPU tests).
#pragma once
#include "deck.hpp"

namespace mpiformer::test {

inline Deck tiny_stage_deck(int zero = 0) {
  Deck d;
  d.model.n_layer = 2;
  d.model.n_head = 2;
  d.model.n_embd = 64;
  d.model.seq_len = 16;
  d.model.vocab_size = 100;
  d.train.micro_batch = 1;
  d.train.global_batch = 1;
  d.parallel.zero = zero;
  return d;
}

}  // namespace mpiformer::test
