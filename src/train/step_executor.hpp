// One optimizer step of one rank: walks its stage's schedule (the same
// action list the tests check), feeding micro-batches, moving activations
// and gradients through the stage's communicators, reducing gradients
// across replicas while backward runs, then clipping and AdamW. Also the
// forward-only walk of evaluation. Every span goes to the trace.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "deck.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/process_grid.hpp"
#include "train/backend_factory.hpp"
#include "train/data_feeder.hpp"
#include "train/loss_scaler.hpp"
#include "train/stage_backend.hpp"
#include "train/step_guard.hpp"
#include "train/trace_writer.hpp"
#include "train/watchdog.hpp"

namespace mpiformer {

struct StepResult {
  double loss = 0, grad_norm = 0, lr = 0;
  bool stop = false;  // every rank agreed to stop after this step
  StepVerdict verdict = StepVerdict::kApply;  // the update applied, skipped, or the run stops
  std::string why;                            // why not applied
  std::string note;                           // said once by the run (gradients all zero)
  std::vector<std::string> data_notes;        // sources that began an epoch
  int64_t skipped_steps = 0;                  // skipped so far in this run
  // The deck key a kStop names ([train] nonfinite, or [train] min_loss_scale
  // when fp16's loss scale would fall below its minimum).
  std::string stop_key = "[train] nonfinite";
  // fp16: the loss scale this step ran with, whether its gradients
  // overflowed (the update skipped, the scale backed off), and the
  // overflows so far in this run.
  bool loss_scaling = false, overflow = false;
  double loss_scale = 1;
  int64_t overflows = 0;
  // A Mixture of Experts (moe): over the step's sparse layers, the mean
  // aux loss per sequence and z loss per token (unweighted), the share of
  // assignments dropped, and the rows the least and most loaded expert of
  // any layer took, over its fair share (1: balanced).
  bool moe = false;
  double aux_loss = 0, z_loss = 0, dropped = 0, load_min = 0, load_max = 0;
};

// Host-side waits within steps, summed until reset.
struct StepTimes {
  double recv_wait = 0;       // blocked receiving activations or gradients
  double reduce_exposed = 0;  // data-parallel reduction not hidden by backward
  double dp_sent_bytes = 0;   // sent to the data-parallel group (ring model)
  double tp_reduce = 0;       // in the tensor group's all-reduces (host: their time)
  double tp_sent_bytes = 0;   // sent to the tensor group (ring model)
  double optimizer = 0;       // in the optimizer step (AdamW, its state's streaming, ZeRO's gathers)
  double ep_exchange = 0;     // in the expert-parallel all-to-alls (host: their time)
  double ep_sent_bytes = 0;   // sent to the rest of the expert-parallel group
  double cp_ring = 0;         // in the context ring's attention passes (arithmetic and waits)
  double cp_arithmetic = 0;   // of which its blocks' arithmetic
  double cp_sent_bytes = 0;   // sent round the ring
};

class StepExecutor {
 public:
  StepExecutor(const Deck& deck, ProcessGrid& grid, StageBackend& stage, StageComms& comms,
               std::vector<Action> actions, TraceWriter& trace, Watchdog& watchdog);
  ~StepExecutor();

  // Step `step` (0-based) from the data feeder's cursor; `out_of_time`: the
  // stop policy's verdict before the step (a signal is checked at its end).
  // Advances the cursor by one global batch.
  StepResult train_step(int64_t step, DataFeeder& data, bool out_of_time, StepTimes& times);
  // Mean loss per token over the evaluation set (collective).
  double evaluate(DataFeeder& data);
  // fp16's loss scaler (its state goes into checkpoints).
  LossScaler& scaler() { return scaler_; }
  // Called on every rank at each step's optimizer action, before the
  // state changes (collective): a background save's deferred snapshot is
  // settled there (CheckpointManager::settle_snapshot).
  void before_update(std::function<void()> settle) { before_update_ = std::move(settle); }

 private:
  const Deck& deck_;
  ProcessGrid& grid_;
  StageBackend& stage_;
  StageComms& comms_;
  std::vector<Action> actions_;
  TraceWriter& trace_;
  Watchdog& watchdog_;
  StepGuard guard_;
  LossScaler scaler_;
  int64_t fault_step_;  // test hook (see the constructor)
  std::function<void()> before_update_;
  std::vector<Pending> act_sends_;  // one per activation slot
  // Input-gradient sends in flight, oldest first, each with its buffer;
  // the buffers free now.
  struct GradSend {
    Pending op;
    int buffer;
  };
  std::deque<GradSend> grad_sends_;
  std::vector<int> free_grad_buffers_;
  void finish_grad_send();
  std::vector<int> slot_of_;  // each action's activation slot (activation_slots)
  int chunks_;                // model chunks per stage (interleaved; else 1)
  // The slot evaluation runs each chunk through: one that holds it in
  // training (a slot of a short chunk alone lacks the other chunks' layers).
  std::vector<int> eval_slot_;
  // Where the stage's tensor all-reduces are reported: the step's times and
  // the micro-batch they belong to (for the trace).
  StepTimes* times_ = nullptr;
  int64_t step_ = 0;
  int micro_ = -1;
  // The step's sums over every rank: the loss, the squared norm, the stop
  // vote, the router's totals and each layer's rows per expert (sized
  // once); where the tensor group's other ranks put their router stats.
  std::vector<double> step_sums_, router_discard_;
  // The step's routing (sums from step_sums_ at totals) into `r`.
  void moe_stats(StepResult& r, const double* totals) const;
};

}  // namespace mpiformer
