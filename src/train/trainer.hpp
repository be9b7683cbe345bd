// The training loop of one rank in a dp x pp grid: data, the pipeline
// schedule of each step (micro-batches, gradient accumulation), the
// data-parallel and tied-embedding reductions, clipping, AdamW, evaluation,
// logs and traces.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "deck.hpp"

namespace mpiformer {

struct TrainResult {
  std::vector<double> losses;  // per step, the same on every rank
  double final_val_loss = 0;   // NaN when the deck has no validation data
  bool stopped_to_requeue = false;  // a signal or the time limit ended it early
};

class Trainer {
 public:
  // Opens the datasets, checks them and the layout against the deck and
  // plans every buffer, then builds the process grid. Collective over
  // MPI_COMM_WORLD (`world` ranks). Throws InputError on anything the user
  // must fix, the same one on every rank (see input_agreement.hpp).
  Trainer(Deck deck, int rank, int world);
  ~Trainer();
  TrainResult run();

 private:
  struct State;
  struct StepTimes;
  struct StepResult {
    double loss, grad_norm, lr;
    bool stop;  // every rank agreed to stop after this step
  };
  void open_inputs(int world);  // local: no collective calls
  void prepare_local();         // local: no collective calls
  void connect();               // collective: grid, communicators, reducer, peak
  void connect_device();        // collective: the communicators of a GPU run
  void resume();                // collective: restore from a checkpoint
  void save_checkpoint(int64_t step);
  void print_summary() const;
  // `want_stop`: this rank's vote to stop after the step (signal, time).
  StepResult train_step(int64_t step, StepTimes& times, bool want_stop);
  double evaluate();
  void check_tied_embedding();

  Deck deck_;
  int rank_;
  std::unique_ptr<State> st_;
};

}  // namespace mpiformer
