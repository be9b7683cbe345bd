// The training run of one rank in a dp x pp grid, assembled from components
// that each own one concern: the data feeder (sample order, windows, the
// global cursor), the stage and its communicators (backend_factory.hpp),
// the step executor (the schedule of each step), the checkpoint manager
// (resume, save, retention), the stop policy (signals, deadlines) and the
// progress log.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "deck.hpp"

namespace mpiformer {

struct NodePlace;
class MetricsLog;
class GoodputLedger;

struct TrainResult {
  std::vector<double> losses;  // per step, the same on every rank
  double final_val_loss = 0;   // NaN when the deck has no validation data
  bool stopped_to_requeue = false;  // a signal or the time limit ended it early
};

class Trainer {
 public:
  // Opens the datasets, checks them and the layout against the deck and
  // plans every buffer, then builds the process grid, the communicators
  // and restores a checkpoint. Collective over MPI_COMM_WORLD (`world`
  // ranks). Throws InputError on anything the user must fix, the same one
  // on every rank (see input_agreement.hpp).
  Trainer(Deck deck, int rank, int world);
  ~Trainer();
  TrainResult run();

 private:
  struct Parts;
  void prepare_local(int world, const NodePlace& node);  // no collective calls
  void connect();                                 // collective
  void print_summary() const;
  // Collective: each rank's resident-memory growth against its stage's
  // prediction, printed by rank 0 and recorded (host back end).
  void report_measured_memory(MetricsLog& metrics) const;
  // Rank 0: the run's goodput so far, and (with [checkpoint] mtbf_hours)
  // the checkpoint interval its own costs suggest.
  void end_of_launch_goodput(const GoodputLedger& goodput) const;
  // Rank 0: the health check's summary and the ranks below the fraction
  // (the record goes to metrics.jsonl).
  void report_health(MetricsLog& metrics) const;

  Deck deck_;
  int rank_;
  std::unique_ptr<Parts> p_;
};

}  // namespace mpiformer
