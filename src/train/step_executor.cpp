#include "train/step_executor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/moe_routing.hpp"
#include "core/format.hpp"
#include "core/test_hooks.hpp"

#include "train/lr_schedule.hpp"
#include "train/stop_policy.hpp"

namespace mpiformer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// What an action waits on, for the watchdog's report ("" for computing).
std::string peer_of(Op op, const ProcessGrid& g) {
  const auto rank_of_stage = [&](int stage) {
    return strprintf("rank %d (stage %d)", g.rank_of_stage(stage), stage);
  };
  switch (op) {
    case Op::RecvActivation: return rank_of_stage(activation_from(g.pp(), g.stage()));
    case Op::RecvGradient: return rank_of_stage(gradient_from(g.pp(), g.stage()));
    case Op::ReduceGradients:
      return strprintf("the %d replicas of stage %d (gradient reduction)", g.dp(), g.stage());
    case Op::OptimizerStep: return "every rank (the step's all-reduce)";
    case Op::Forward:
    case Op::Backward:
    case Op::WeightGradients:
      // Inside them, each block waits on its tensor group's all-reduces.
      if (g.tp() > 1) {
        const int first = g.world_rank() - g.tp_rank();
        return strprintf("its tensor group, ranks %d-%d (all-reduces inside every block)", first,
                         first + g.tp() - 1);
      }
      return "";
    default: return "";
  }
}

}  // namespace

StepExecutor::StepExecutor(const Deck& deck, ProcessGrid& grid, StageBackend& stage,
                           StageComms& comms, std::vector<Action> actions, TraceWriter& trace,
                           Watchdog& watchdog)
    : deck_(deck),
      grid_(grid),
      stage_(stage),
      comms_(comms),
      actions_(std::move(actions)),
      trace_(trace),
      watchdog_(watchdog),
      guard_(deck.train.nonfinite, deck.train.spike_zscore, deck.train.skip_limit),
      scaler_(LossScaler::from_deck(deck.train)),
      act_sends_(static_cast<size_t>(stage.num_slots())),
      slot_of_(activation_slots(actions_)),
      chunks_(static_cast<int>(stage.range().chunks)),
      step_sums_(static_cast<size_t>(3 + kRouterTotals + deck.model.n_layer * deck.model.experts)),
      router_discard_(static_cast<size_t>(kRouterTotals + deck.model.n_layer * deck.model.experts)) {
  for (int b = stage.grad_send_buffers() - 1; b >= 0; --b) free_grad_buffers_.push_back(b);
  eval_slot_.assign(static_cast<size_t>(chunks_), -1);
  for (size_t i = 0; i < actions_.size(); ++i) {
    int& e = eval_slot_[static_cast<size_t>(std::max(actions_[i].chunk, 0))];
    if (actions_[i].op == Op::Forward && e < 0) e = slot_of_[i];
  }
  // core/test_hooks.hpp (host back end: the gradients are host memory there).
  fault_step_ = stage.on_device() ? -1 : test_hooks::fault_nonfinite_step();
  if (grid.tp() > 1 || grid.ep() > 1 || grid.cp() > 1) {
    stage.observe_tensor_reductions(
        [this](const char* op, Clock::time_point t0, Clock::time_point t1, double bytes) {
          trace_.span(op, t0, t1, step_ + 1, micro_);
          if (times_ == nullptr) return;
          // The ring's span is attention's arithmetic and the waits for
          // the next block; its block spans, the arithmetic.
          if (std::strcmp(op, kContextRing) == 0) {
            times_->cp_ring += seconds(t0, t1);
            times_->cp_sent_bytes += bytes;
            return;
          }
          if (std::strcmp(op, kContextBlock) == 0) {
            times_->cp_arithmetic += seconds(t0, t1);
            return;
          }
          const bool experts = std::strcmp(op, kExpertAllToAll) == 0;  // no allocation per op
          (experts ? times_->ep_exchange : times_->tp_reduce) += seconds(t0, t1);
          (experts ? times_->ep_sent_bytes : times_->tp_sent_bytes) += bytes;
        });
  }
}

StepExecutor::~StepExecutor() = default;

void StepExecutor::finish_grad_send() {
  if (grad_sends_.empty()) throw std::logic_error("train_step: a gradient send without a buffer");
  grad_sends_.front().op.reset();  // waits
  free_grad_buffers_.push_back(grad_sends_.front().buffer);
  grad_sends_.pop_front();
}

StepResult StepExecutor::train_step(int64_t step, DataFeeder& data, bool out_of_time,
                                    StepTimes& times) {
  ProcessGrid& g = grid_;
  StageBackend& stage = stage_;
  const TrainConfig& tc = deck_.train;
  const int64_t T = deck_.model.seq_len;
  const size_t bytes = stage.message_bytes();
  const int M = static_cast<int>(deck_.grad_accum());
  const int slots = stage.num_slots();
  // The loss is the mean over the global batch's tokens; fp16 scales its
  // gradient by the loss scale (unscaled again before clipping and AdamW).
  const double loss_scale = scaler_.scale();
  const float grad_scale =
      static_cast<float>(loss_scale / static_cast<double>(tc.global_batch * T));

  while (!grad_sends_.empty()) finish_grad_send();  // an earlier step's, cut short
  stage.zero_grads();
  StepResult result;
  times_ = &times;
  step_ = step;
  const int pp = g.pp(), v = chunks_;
  for (size_t index = 0; index < actions_.size(); ++index) {
    const Action& a = actions_[index];
    const int slot = std::max(slot_of_[index], 0);
    if (slot >= slots) throw std::logic_error("train_step: an activation slot the stage lacks");
    micro_ = a.micro;
    watchdog_.enter(a.micro >= 0 ? strprintf("%s of micro-batch %d", op_name(a.op), a.micro)
                                 : std::string(op_name(a.op)),
                    step + 1, peer_of(a.op, g));
    const auto t0 = Clock::now();
    switch (a.op) {
      case Op::RecvActivation:
        // The slot's previous occupant may still be on its way downstream
        // (its output is another buffer, unless a chunk has no layers).
        act_sends_[slot].reset();
        comms_.pipe_act->recv_bytes(stage.input_buffer(slot), bytes,
                                    activation_from(pp, g.stage()),
                                    activation_tag(a.micro, a.chunk, v));
        times.recv_wait += seconds(t0, Clock::now());
        break;
      case Op::Forward:
        act_sends_[slot].reset();
        // Only the ends of the model touch tokens: inputs where it embeds,
        // targets where it ends in the head; under the document mask or context
        // parallelism every stage reads the positions (its attention and
        // rotations do).
        if (data.has_positions() || first_virtual(g.stage(), a.chunk) ||
            last_virtual(pp, g.stage(), a.chunk, v))
          data.load_train(a.micro, slot);
        stage.forward(slot, data.inputs(slot), data.targets(slot), true, grad_scale, a.chunk,
                      data.positions(slot));
        break;
      case Op::SendActivation: {
        const PipePeer to = activation_to(pp, g.stage(), a.chunk);
        act_sends_[slot] = comms_.pipe_act->start_send_bytes(
            stage.output(slot), bytes, to.stage, activation_tag(a.micro, to.chunk, v));
        break;
      }
      case Op::RecvGradient:
        comms_.pipe_grad->recv_bytes(stage.output_grad_buffer(), bytes,
                                     gradient_from(pp, g.stage()),
                                     gradient_tag(a.micro, a.chunk, v));
        times.recv_wait += seconds(t0, Clock::now());
        break;
      case Op::Backward:
      case Op::WeightGradients: {
        // Split backward keeps the output's gradient in the output (long
        // since received downstream; its send's request is closed first).
        if (splits_backward(deck_.parallel.schedule)) act_sends_[slot].reset();
        // The last micro-batch's backward (its W, where split) finishes
        // the gradients: the stage reduces them across replicas as
        // backward finishes them.
        if (a.op == Op::WeightGradients) stage.weight_gradients(slot, a.micro == M - 1, a.chunk);
        else stage.backward(slot, a.micro == M - 1, a.chunk);
        break;
      }
      case Op::SendGradient: {
        // None free: wait for the oldest (the receiver takes them in
        // order); gradient_send_buffers counted enough that every stage's
        // step still runs to its end.
        if (free_grad_buffers_.empty()) finish_grad_send();
        const int buffer = free_grad_buffers_.back();
        free_grad_buffers_.pop_back();
        const PipePeer to = gradient_to(pp, g.stage(), a.chunk);
        grad_sends_.push_back(GradSend{
            comms_.pipe_grad->start_send_bytes(stage.input_grad_for_send(buffer), bytes, to.stage,
                                               gradient_tag(a.micro, to.chunk, v)),
            buffer});
        break;
      }
      case Op::ReduceGradients:
        // And the tied embedding's two copies summed, so identical updates
        // keep them identical; likewise a kv head's copies on the tensor
        // ranks sharing it.
        times.reduce_exposed += stage.finish_reduction(comms_.tied, comms_.kv);
        break;
      case Op::OptimizerStep: {
        // Nothing has changed the state since the last save: a snapshot
        // copied beside this step is complete before anything does.
        if (before_update_) before_update_();
        // Each parameter counted once: one replica per stage, and the tied
        // embedding only on the first stage. The stop votes ride along, so
        // agreeing on preemption costs no extra collective. On a GPU these
        // are the step's only copies to the host: the loss and the squared
        // norm, which the log shows and clipping needs.
        if (step + 1 == fault_step_ && g.world_rank() == 0) stage.make_gradient_nonfinite();
        // Every rank of a tensor group computes the same losses: its rank
        // 0 counts them, and the tensors the group replicates.
        // A Mixture of Experts' routing rides along too (its totals, then
        // every layer's rows per expert).
        const double loss_sum = stage.take_loss_sum();
        std::vector<double>& sums = step_sums_;
        std::fill(sums.begin(), sums.end(), 0.0);
        sums[0] = g.tp_rank() == 0 ? loss_sum : 0.0;
        sums[2] = StopPolicy::vote(out_of_time) ? 1.0 : 0.0;
        sums[1] = stage.grad_sum_of_squares(g.pp() > 1 && g.last_stage(), g.tp_rank() != 0);
        if (g.tp_rank() == 0) stage.take_router_stats(&sums[3], &sums[3 + kRouterTotals]);
        else stage.take_router_stats(router_discard_.data(), router_discard_.data() + kRouterTotals);
        g.world().allreduce_sum(sums.data(), static_cast<int64_t>(sums.size()));
        result.loss = sums[0] / static_cast<double>(tc.global_batch * T);
        if (deck_.model.moe()) moe_stats(result, sums.data() + 3);
        result.stop = sums[2] > 0;
        // NaN stays NaN through max and sqrt: the guard sees it. The norm
        // of the unscaled gradients is what clipping and the log use.
        const double norm = std::sqrt(std::max(sums[1], 0.0)) / loss_scale;
        const double clip = (tc.grad_clip > 0 && norm > tc.grad_clip) ? tc.grad_clip / norm : 1.0;
        const double lr = learning_rate(tc.lr, tc.min_lr, tc.warmup_steps, tc.steps, step);
        result.loss_scaling = scaler_.active();
        result.loss_scale = loss_scale;
        // An fp16 overflow is the dynamic scaler's to handle, not a fault;
        // a non-finite loss (the scale plays no part in it) is the guard's.
        LossScaler::Verdict scaled = LossScaler::Verdict::kApply;
        if (scaler_.dynamic() && std::isfinite(result.loss))
          scaled = scaler_.after_step(std::isfinite(sums[1]));
        if (scaled == LossScaler::Verdict::kApply) {
          result.verdict = guard_.judge(result.loss, norm);
          result.why = guard_.why();
        } else {
          result.overflow = true;
          result.verdict =
              scaled == LossScaler::Verdict::kOverflow ? StepVerdict::kSkip : StepVerdict::kStop;
          result.why = scaler_.why();
          if (scaled == LossScaler::Verdict::kTooSmall) result.stop_key = "[train] min_loss_scale";
        }
        result.skipped_steps = guard_.skipped();
        result.overflows = scaler_.overflows();
        if (result.verdict == StepVerdict::kApply &&
            guard_.zero_gradient_steps() == StepGuard::kZeroGradientSteps) {
          result.note = strprintf(
              "the gradients have been exactly zero for %lld steps: nothing trains%s",
              static_cast<long long>(StepGuard::kZeroGradientSteps),
              scaler_.active()
                  ? strprintf(" (fp16 with loss scale %g: the scaled gradients underflow to zero; "
                              "raise [train] loss_scale or use \"dynamic\")",
                              loss_scale).c_str()
                  : " (the data, or a model whose output does not depend on its parameters)");
        }
        if (result.verdict == StepVerdict::kApply) {
          const auto a0 = Clock::now();
          stage.adamw_step(lr, step + 1, clip / loss_scale);
          times.optimizer += std::chrono::duration<double>(Clock::now() - a0).count();
        } else {
          // What compression kept of a gradient that is not applied (a
          // non-finite one, perhaps) is not carried into the next.
          stage.forget_compression_state();
        }
        result.grad_norm = norm;
        result.lr = lr;
        break;
      }
    }
    trace_.span(op_name(a.op), t0, Clock::now(), step + 1, a.micro,
                v > 1 && a.micro >= 0 ? a.chunk : -1);
  }
  for (auto& p : act_sends_) p.reset();
  while (!grad_sends_.empty()) finish_grad_send();
  // ZeRO's gathers after AdamW belong to this step too.
  if (g.dp() > 1) times.dp_sent_bytes += stage.take_sent_bytes();
  trace_.flush();
  result.data_notes = data.next_step();
  times_ = nullptr;  // evaluation's reductions are not the step's
  return result;
}

void StepExecutor::moe_stats(StepResult& r, const double* totals) const {
  const GptConfig& m = deck_.model;
  const double layers = static_cast<double>(m.moe_layers());
  const double sequences = static_cast<double>(deck_.train.global_batch);
  const double tokens = sequences * static_cast<double>(m.seq_len);
  const double assignments = tokens * static_cast<double>(m.top_k);
  r.moe = true;
  r.aux_loss = totals[kAuxSum] / (sequences * layers);
  r.z_loss = totals[kZSum] / (tokens * layers);
  r.dropped = totals[kDropped] / (assignments * layers);
  // Each expert's rows over its fair share of the layer's assignments.
  const double* load = totals + kRouterTotals;
  const double fair = assignments / static_cast<double>(m.experts);
  r.load_min = std::numeric_limits<double>::infinity();
  r.load_max = 0;
  for (int64_t l = 0; l < m.n_layer; ++l) {
    if (!m.moe_layer(l)) continue;
    for (int64_t e = 0; e < m.experts; ++e) {
      const double x = load[l * m.experts + e] / fair;
      r.load_min = std::min(r.load_min, x);
      r.load_max = std::max(r.load_max, x);
    }
  }
}

double StepExecutor::evaluate(DataFeeder& data) {
  ProcessGrid& g = grid_;
  StageBackend& stage = stage_;
  const size_t bytes = stage.message_bytes();
  watchdog_.enter("evaluation", 0, "the pipeline's neighbours and every rank");
  // Forward only, one micro-batch (and chunk) at a time, each chunk
  // through one slot that holds it in training (eval_slot_).
  const int pp = g.pp(), v = chunks_;
  for (const Action& a :
       forward_only_schedule(pp, g.stage(), data.eval_micro_batches(), v)) {
    const int slot = eval_slot_[static_cast<size_t>(a.chunk)];
    switch (a.op) {
      case Op::RecvActivation:
        comms_.pipe_act->recv_bytes(stage.input_buffer(slot), bytes,
                                    activation_from(pp, g.stage()),
                                    activation_tag(a.micro, a.chunk, v));
        break;
      case Op::Forward:
        if (data.has_positions() || first_virtual(g.stage(), a.chunk) ||
            last_virtual(pp, g.stage(), a.chunk, v))
          data.load_eval(a.micro, slot);
        stage.forward(slot, data.inputs(slot), data.targets(slot), false, 0.0f, a.chunk,
                      data.positions(slot));
        break;
      case Op::SendActivation: {
        // Waited at once: the slot is overwritten by the chunk's next forward.
        const PipePeer to = activation_to(pp, g.stage(), a.chunk);
        comms_.pipe_act->start_send_bytes(stage.output(slot), bytes, to.stage,
                                          activation_tag(a.micro, to.chunk, v))
            ->wait();
        break;
      }
      default:
        break;
    }
  }
  double sum = stage.take_loss_sum();
  // Evaluation's routing is not a training step's.
  stage.take_router_stats(router_discard_.data(), router_discard_.data() + kRouterTotals);
  if (g.tp_rank() != 0) sum = 0;  // the tensor group's ranks all hold it
  g.world().allreduce_sum(&sum, 1);
  return sum / static_cast<double>(data.eval_windows() * deck_.model.seq_len);
}

}  // namespace mpiformer
