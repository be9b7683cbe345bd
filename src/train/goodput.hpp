// Goodput: how much of the time a run held its ranks went into steps whose
// results it kept. A run directory's ledger (<run.dir>/goodput.txt, rank
// 0's) carries the figures across launches: each launch's wall time (from
// its process's start), its start-up (restore included), steps, blocking
// saves and evaluations, and the productive step time through each
// checkpoint it saved. A launch that resumes from step s settles the one
// before: the steps after s that it had done are redone, their time lost.
//
//   goodput = productive step time / the launches' wall time
//
// The gaps between launches (a queue, a requeue's wait) are reported
// beside it, not in it: no launch held the ranks then. The ledger is
// bookkeeping: one that cannot be read (damaged, written by hand) is named
// in a warning and the figures start again from this launch; it never
// stops a run.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mpiformer {

// What the ledger adds up (seconds, except the counts).
struct GoodputTotals {
  int64_t launches = 0;
  int64_t steps_redone = 0;   // steps done and later done again after a restart
  double wall = 0;            // the launches' wall time, each from its process's start
  double startup = 0;         // process start to the first step (restore included)
  double restore = 0;         // of which reading a checkpoint
  double steps = 0;           // every step's time, kept or redone
  double productive = 0;      // the steps whose results the run kept
  double saves = 0;           // checkpoint saves (the part training waited for)
  double evals = 0;
  double between = 0;         // gaps between launches (not in `wall`)
  int64_t save_count = 0;
  int64_t step_count = 0;     // steps done, kept or redone
  double goodput() const { return wall > 0 ? productive / wall : 0; }
};

class GoodputLedger {
 public:
  // `active`: the rank that keeps the ledger (rank 0); the others keep none.
  // `resumed`, `resume_step`: this launch's start; a launch that does not
  // resume starts a new ledger.
  GoodputLedger(std::string run_dir, bool active, bool resumed, int64_t resume_step);

  void restored(double seconds) { cur_.restore += seconds; }
  // The first step begins: start-up ends.
  void steps_begin();
  void step_done(int64_t step, double seconds);
  // A synchronous save: training waited `seconds`; the checkpoint of
  // `step` holds the steps through it.
  void save_done(int64_t step, double seconds);
  // A background save's parts: the time training waited for it (the
  // snapshot, a wait for its write), and, once it is published, the
  // checkpoint of `step` with the productive step time through that step
  // (productive() when its snapshot was taken).
  void save_waited(double seconds);
  void checkpoint_kept(int64_t step, double productive_through);
  double productive() const { return base_ + cur_.steps; }
  void eval_done(double seconds);
  // Writes the ledger with this launch's figures so far: whole always,
  // `durable` (flushed to disk) at saves and the end; a failure (a full
  // disk) is a warning, once.
  void write(bool durable = true);
  // The run's figures through now, this launch included.
  GoodputTotals totals() const;
  // Seconds the average save made training wait (0: none yet).
  double mean_save() const;
  // One JSON object ({"goodput": {...}}) and one line for the log.
  std::string json() const;
  std::string line() const;
  // A warning to print (a ledger that could not be read), or "".
  const std::string& warning() const { return warning_; }
  const std::string& path() const { return path_; }

 private:
  struct Launch {
    double started = 0;  // unix seconds at the process's start
    double updated = 0;  // unix seconds at the last write
    int64_t resumed_from = 0, step = 0;
    double startup = 0, restore = 0, steps = 0, saves = 0, evals = 0;
    int64_t save_count = 0, step_count = 0;
  };
  void read_previous(int64_t resume_step);
  std::string path_;
  bool active_;
  std::string warning_;
  GoodputTotals settled_;  // launches before this one, settled
  // (step, productive step seconds through it) of every checkpoint this
  // launch could resume from: earlier launches' up to where this one
  // resumed, then this one's.
  std::vector<std::pair<int64_t, double>> kept_;
  double base_ = 0;  // productive step seconds through this launch's resume step
  Launch cur_;
  bool stepping_ = false;
  bool write_failed_ = false;
};

// Young and Daly's first-order optimum checkpoint interval, in seconds:
// sqrt(2 x the time a save costs x the mean time between failures).
double young_daly_interval(double save_seconds, double mtbf_seconds);

}  // namespace mpiformer
