// One training step (the pipeline schedule walked for every micro-batch)
// and evaluation.
#include "train/trainer.hpp"

#include "train/trainer_state.hpp"

namespace mpiformer {

Trainer::StepResult Trainer::train_step(int64_t step, StepTimes& times, bool want_stop) {
  State& s = *st_;
  ProcessGrid& g = *s.grid;
  StageBackend& stage = *s.stage;
  TraceWriter& trace = *s.trace;
  const TrainConfig& tc = deck_.train;
  const int64_t B = tc.micro_batch, T = s.cfg.seq_len;
  const size_t bytes = stage.message_bytes();
  const int M = static_cast<int>(deck_.grad_accum());
  const int slots = stage.num_slots();
  const float grad_scale = 1.0f / static_cast<float>(tc.global_batch * T);

  // Sample j of the step lives at global position cursor + j, whichever
  // rank and micro-batch reads it: replica r's micro-batch m holds samples
  // (m * dp + r) * micro_batch + b. The cursor, not the step, is the data
  // position, so a resume with another global_batch continues exactly.
  auto load = [&](int micro, int slot) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t j = (static_cast<int64_t>(micro) * g.dp() + g.dp_rank()) * B + b;
      s.train.read_window(s.order->window(s.cursor + j), T, s.window.data());
      std::copy(s.window.begin(), s.window.end() - 1, s.inputs[slot].begin() + b * T);
      std::copy(s.window.begin() + 1, s.window.end(), s.targets[slot].begin() + b * T);
    }
  };

  stage.zero_grads();
  StepResult result{0, 0, 0, false};
  for (const Action& a : s.actions) {
    const int slot = a.micro >= 0 ? a.micro % slots : 0;
    const auto t0 = Clock::now();
    switch (a.op) {
      case Op::RecvActivation:
        s.pipe_act->recv_bytes(stage.input_buffer(slot), bytes, g.stage() - 1,
                               activation_tag(a.micro));
        times.recv_wait += seconds(t0, Clock::now());
        break;
      case Op::Forward:
        // The slot's previous occupant may still be on its way downstream.
        if (s.act_sends[slot]) s.act_sends[slot].reset();
        // Only the ends of the pipeline touch tokens: inputs on the first
        // stage, targets on the last.
        if (g.first_stage() || g.last_stage()) load(a.micro, slot);
        stage.forward(slot, s.inputs[slot].data(), s.targets[slot].data(), true, grad_scale);
        break;
      case Op::SendActivation:
        s.act_sends[slot] = s.pipe_act->start_send_bytes(stage.output(slot), bytes, g.stage() + 1,
                                                         activation_tag(a.micro));
        break;
      case Op::RecvGradient:
        s.pipe_grad->recv_bytes(stage.output_grad_buffer(), bytes, g.stage() + 1,
                                gradient_tag(a.micro));
        times.recv_wait += seconds(t0, Clock::now());
        break;
      case Op::Backward: {
        // The last micro-batch's backward finishes the gradients: reduce
        // each bucket across replicas as soon as it is final.
        const bool overlap = a.micro == M - 1 && g.dp() > 1;
        if (overlap) s.reducer->begin(stage.grads());
        stage.backward(slot, overlap ? GradsFinal([&](int64_t offset) {
          s.reducer->grads_final_from(offset);
        })
                                     : nullptr);
        break;
      }
      case Op::SendGradient:
        if (s.grad_sends[slot]) s.grad_sends[slot].reset();
        s.grad_sends[slot] = s.pipe_grad->start_send_bytes(stage.input_grad_for_send(slot), bytes,
                                                           g.stage() - 1, gradient_tag(a.micro));
        break;
      case Op::ReduceGradients:
        if (g.dp() > 1) times.reduce_exposed += s.reducer->finish();
        // The two copies of the tied embedding receive the sum of both
        // stages' gradients, so identical updates keep them identical.
        if (s.tied != nullptr) {
          const auto& wte = stage.table().at("wte");
          s.tied->allreduce_sum(stage.grads() + wte.offset, wte.storage);
        }
        break;
      case Op::OptimizerStep: {
        // Each parameter counted once: one replica per stage, and the tied
        // embedding only on the first stage. The stop votes ride along, so
        // agreeing on preemption costs no extra collective.
        // On a GPU these are the step's only copies to the host: the loss
        // and the squared norm, which the log shows and clipping needs.
        double sums[3] = {stage.take_loss_sum(), 0.0,
                          want_stop || stop_signal() != 0 ? 1.0 : 0.0};
        if (g.dp_rank() == 0) {
          sums[1] = stage.grad_sum_of_squares(0, stage.param_storage());
          if (g.pp() > 1 && g.last_stage()) {
            const auto& wte = stage.table().at("wte");
            sums[1] -= stage.grad_sum_of_squares(wte.offset, wte.storage);
          }
        }
        g.world().allreduce_sum(sums, 3);
        result.loss = sums[0] / static_cast<double>(tc.global_batch * T);
        result.stop = sums[2] > 0;
        const double norm = std::sqrt(std::max(sums[1], 0.0));
        const double clip = (tc.grad_clip > 0 && norm > tc.grad_clip) ? tc.grad_clip / norm : 1.0;
        const double lr = learning_rate(tc.lr, tc.min_lr, tc.warmup_steps, tc.steps, step);
        stage.adamw_step(lr, step + 1, clip);
        result.grad_norm = norm;
        result.lr = lr;
        break;
      }
    }
    trace.span(op_name(a.op), t0, Clock::now(), step + 1, a.micro);
  }
  for (auto& p : s.act_sends) p.reset();
  for (auto& p : s.grad_sends) p.reset();
  trace.flush();
  s.cursor += tc.global_batch;
  return result;
}

double Trainer::evaluate() {
  State& s = *st_;
  ProcessGrid& g = *s.grid;
  StageBackend& stage = *s.stage;
  const int64_t B = deck_.train.micro_batch, T = s.cfg.seq_len;
  const size_t bytes = stage.message_bytes();
  // Evaluation micro-batch k goes to replica k % dp; forward only, one at a
  // time, through slot 0.
  const int local = static_cast<int>(s.eval_windows.size() / (B * g.dp()));
  for (const Action& a : forward_only_schedule(g.pp(), g.stage(), local)) {
    switch (a.op) {
      case Op::RecvActivation:
        s.pipe_act->recv_bytes(stage.input_buffer(0), bytes, g.stage() - 1, activation_tag(a.micro));
        break;
      case Op::Forward: {
        const int64_t k = static_cast<int64_t>(a.micro) * g.dp() + g.dp_rank();
        for (int64_t b = 0; b < B; ++b) {
          s.val->read_window(s.eval_windows[k * B + b], T, s.window.data());
          std::copy(s.window.begin(), s.window.end() - 1, s.inputs[0].begin() + b * T);
          std::copy(s.window.begin() + 1, s.window.end(), s.targets[0].begin() + b * T);
        }
        stage.forward(0, s.inputs[0].data(), s.targets[0].data(), false, 0.0f);
        break;
      }
      case Op::SendActivation:
        // Waited at once: slot 0 is overwritten by the next forward.
        s.pipe_act->start_send_bytes(stage.output(0), bytes, g.stage() + 1, activation_tag(a.micro))
            ->wait();
        break;
      default:
        break;
    }
  }
  double sum = stage.take_loss_sum();
  g.world().allreduce_sum(&sum, 1);
  return sum / static_cast<double>(s.eval_windows.size() * T);
}

}  // namespace mpiformer
