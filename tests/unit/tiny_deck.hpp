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

// GPT-2 124M's shape (12 x 768, 12 heads, seq 1024, vocab 50257): for
// tests of accounting and planning at a real model's size.
inline GptConfig gpt2_124m_shape() {
  GptConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.seq_len = 1024;
  c.vocab_size = 50257;
  return c;
}

}  // namespace mpiformer::test
