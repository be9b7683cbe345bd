#include "parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace mpiformer {

const char* op_name(Op op) {
  switch (op) {
    case Op::RecvActivation: return "recv_activation";
    case Op::Forward: return "forward";
    case Op::SendActivation: return "send_activation";
    case Op::RecvGradient: return "recv_gradient";
    case Op::Backward: return "backward";
    case Op::SendGradient: return "send_gradient";
    case Op::WeightGradients: return "weight_gradients";
    case Op::ReduceGradients: return "reduce_gradients";
    case Op::OptimizerStep: return "optimizer_step";
  }
  return "?";
}

namespace {

struct Builder {
  int num_stages, stage;
  std::vector<Action> out;
  bool first() const { return stage == 0; }
  bool last() const { return stage == num_stages - 1; }
  void forward(int m) {
    if (!first()) out.push_back({Op::RecvActivation, m});
    out.push_back({Op::Forward, m});
    if (!last()) out.push_back({Op::SendActivation, m});
  }
  void backward(int m) {
    if (!last()) out.push_back({Op::RecvGradient, m});
    out.push_back({Op::Backward, m});
    if (!first()) out.push_back({Op::SendGradient, m});
  }
  // The W's owed, in micro-batch order, until at most `deferred` are.
  int weights_done = 0;
  void weights_until(int done) {
    while (weights_done < done) out.push_back({Op::WeightGradients, weights_done++});
  }
};

}  // namespace

std::vector<Action> pipeline_schedule(ScheduleKind kind, int num_stages, int stage,
                                      int num_micro) {
  Builder b{num_stages, stage, {}};
  if (kind == ScheduleKind::kGPipe) {
    for (int m = 0; m < num_micro; ++m) b.forward(m);
    for (int m = 0; m < num_micro; ++m) b.backward(m);
  } else {
    // zb-h1: stage s keeps s W's owed; 1F1B: none (its backward has them).
    const int deferred = kind == ScheduleKind::kZbH1 ? stage : 0;
    const bool split = splits_backward(kind);
    auto backward = [&](int m) {
      b.backward(m);
      if (split) b.weights_until(m + 1 - deferred);
    };
    // Warm-up: enough forwards to fill the pipeline below this stage.
    const int warmup = std::min(num_stages - stage - 1, num_micro);
    for (int m = 0; m < warmup; ++m) b.forward(m);
    // Steady state: each new forward is followed by the oldest backward.
    for (int m = warmup; m < num_micro; ++m) {
      b.forward(m);
      backward(m - warmup);
    }
    // Cool-down: drain the backwards still owed, then the W's.
    for (int m = num_micro - warmup; m < num_micro; ++m) backward(m);
    if (split) b.weights_until(num_micro);
  }
  b.out.push_back({Op::ReduceGradients, -1});
  b.out.push_back({Op::OptimizerStep, -1});
  return b.out;
}

std::vector<Action> forward_only_schedule(int num_stages, int stage, int num_micro) {
  Builder b{num_stages, stage, {}};
  for (int m = 0; m < num_micro; ++m) b.forward(m);
  return b.out;
}

int max_live_activations(const std::vector<Action>& actions) {
  const bool split = std::any_of(actions.begin(), actions.end(),
                                 [](const Action& a) { return a.op == Op::WeightGradients; });
  const Op closes = split ? Op::WeightGradients : Op::Backward;
  int live = 0, most = 0;
  for (const auto& a : actions) {
    if (a.op == Op::Forward) most = std::max(most, ++live);
    if (a.op == closes) --live;
  }
  return std::max(most, 1);
}

}  // namespace mpiformer
