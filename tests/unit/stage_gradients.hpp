// Test support: every parameter gradient of a host stage in double against
// central finite differences of its loss (the stage's own forward, so the
// check covers backward, whatever the model computes; each family's
// forward is checked against independent references elsewhere). Shared
// by the GPT-2 and Llama model tests.
#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "model/gpt_stage.hpp"
#include "reference.hpp"

namespace mpiformer::test {

// Every tensor drawn from normal(0, 0.3), larger than either family's
// initialisation so every nonlinearity is exercised.
inline void randomise_parameters(HostGptStage<double>& stage, unsigned seed) {
  for (const auto& s : stage.table().specs()) {
    const auto r = random_vector(static_cast<size_t>(s.numel()), seed++, 0.3);
    std::memcpy(stage.params() + s.offset, r.data(), sizeof(double) * r.size());
  }
}

// Runs one forward and backward of (tok, tgt) with the loss scaled by
// `scale` (and `positions`, for a stage with the document mask), then
// checks each tensor; returns the elements checked. h = 1e-5
// in double: truncation ~h^2 * |third derivative| ~ 1e-10, rounding
// ~1e-16 * |L| / h ~ 1e-11; 1e-7 absolute leaves a wide margin while a
// wrong term (typically >= 1e-3 here) still fails.
//
// A Mixture of Experts' loss also has its router's: the aux loss (a mean
// over sequences of T tokens) and the z loss (over tokens), each weighed
// by the model's coefficient, which backward's scale divides alike.
inline double router_losses(HostGptStage<double>& stage, double scale) {
  const GptConfig& c = stage.config();
  double totals[kRouterTotals] = {};
  std::vector<double> load(static_cast<size_t>(c.n_layer * c.experts));
  stage.take_router_stats(totals, load.data());
  return scale * (c.aux_loss * static_cast<double>(c.seq_len) * totals[kAuxSum] +
                  c.router_z_loss * totals[kZSum]);
}

// The stage's gradients of `scale` x the summed loss (and the router's
// losses) of one micro-batch, computed by backward.
inline std::vector<double> backward_gradients(HostGptStage<double>& stage,
                                              const std::vector<int32_t>& tok,
                                              const std::vector<int32_t>& tgt, double scale,
                                              const int32_t* positions = nullptr) {
  stage.zero_grads();
  stage.forward(0, tok.data(), tgt.data(), true, scale, 0, positions);
  stage.backward(0);
  stage.take_loss_sum();
  router_losses(stage, scale);
  return std::vector<double>(stage.grads(), stage.grads() + stage.table().total_numel());
}

inline int64_t expect_gradients_match_finite_differences(HostGptStage<double>& stage,
                                                         const std::vector<int32_t>& tok,
                                                         const std::vector<int32_t>& tgt,
                                                         double scale, const std::string& label,
                                                         const int32_t* positions = nullptr) {
  backward_gradients(stage, tok, tgt, scale, positions);
  int64_t checked = 0;
  for (const auto& s : stage.table().specs()) {
    std::vector<double> x(stage.params() + s.offset, stage.params() + s.offset + s.numel());
    auto loss = [&] {
      std::memcpy(stage.params() + s.offset, x.data(), sizeof(double) * x.size());
      stage.forward(0, tok.data(), tgt.data(), false, 0.0, 0, positions);
      return scale * stage.take_loss_sum() + router_losses(stage, scale);
    };
    const auto want = finite_difference(x, loss, 1e-5);
    loss();  // restore the unperturbed values
    const std::vector<double> got(stage.grads() + s.offset, stage.grads() + s.offset + s.numel());
    EXPECT_TRUE(all_close(got, want, 1e-7, 1e-5)) << s.name << label;
    checked += s.numel();
  }
  return checked;
}

}  // namespace mpiformer::test
