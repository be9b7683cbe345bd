// The training loop of one rank: data, forward/backward over the step's
// micro-batches (gradient accumulation), clipping, AdamW, evaluation, logs.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "deck.hpp"

namespace mpiformer {

struct TrainResult {
  std::vector<double> losses;  // per step
  double final_val_loss = 0;   // NaN when the deck has no validation data
};

class Trainer {
 public:
  // Opens the datasets and checks them against the deck; `world` is the
  // number of MPI ranks. Throws InputError on anything the user must fix.
  Trainer(Deck deck, int rank, int world);
  ~Trainer();
  const Deck& deck() const { return deck_; }
  TrainResult run();

 private:
  struct State;
  Deck deck_;
  int rank_;
  std::unique_ptr<State> st_;
};

}  // namespace mpiformer
