// The host back end: GptStage<float> and AdamW on the CPU.
#include <cstring>
#include <utility>
#include <vector>

#include "host/adamw.hpp"
#include "model/gpt_stage.hpp"
#include "train/model_flops.hpp"
#include "train/stage_backend.hpp"

namespace mpiformer {

namespace {

class HostStageBackend final : public StageBackend {
 public:
  HostStageBackend(const GptConfig& cfg, const StageRange& range, int64_t micro_batch, int slots,
                   const AdamWSettings& adam)
      : stage_(cfg, range, micro_batch, slots),
        opt_(stage_.table(), adam),
        bt_c_(micro_batch * cfg.seq_len * cfg.n_embd),
        grad_out_(range.has_embedding ? 0 : slots, std::vector<float>(bt_c_)),
        grad_in_(range.has_head ? 0 : bt_c_) {}

  const ParameterTable& table() const override { return stage_.table(); }
  const StageRange& range() const override { return stage_.range(); }
  int num_slots() const override { return stage_.num_slots(); }
  int64_t param_storage() const override { return stage_.param_storage(); }
  size_t message_bytes() const override { return sizeof(float) * static_cast<size_t>(bt_c_); }
  std::string describe() const override { return "cpu fp32"; }
  bool on_device() const override { return false; }
  double measure_peak_flops() override { return measure_sgemm_peak(); }
  void init_parameters(uint64_t seed) override { stage_.init_parameters(seed); }
  void zero_grads() override { stage_.zero_grads(); }
  void* input_buffer(int slot) override { return stage_.input_buffer(slot); }
  const void* output(int slot) const override { return stage_.output(slot); }
  void* output_grad_buffer() override { return grad_in_.data(); }

  void forward(int slot, const int32_t* tokens, const int32_t* targets, bool for_backward,
               float grad_scale) override {
    loss_sum_ += stage_.forward(slot, tokens, stage_.input_buffer(slot), targets, for_backward,
                                grad_scale);
  }
  void backward(int slot, const int32_t* tokens, const GradsFinal& grads_final) override {
    stage_.backward(slot, tokens, range().has_head ? nullptr : grad_in_.data(), grads_final);
  }
  const void* input_grad_for_send(int slot) override {
    std::memcpy(grad_out_[slot].data(), stage_.input_grad(), message_bytes());
    return grad_out_[slot].data();
  }
  double take_loss_sum() override { return std::exchange(loss_sum_, 0.0); }

  float* grads() override { return stage_.grads(); }
  double grad_sum_of_squares(int64_t offset, int64_t n) override {
    return host::sum_of_squares(stage_.grads() + offset, n);
  }
  void adamw_step(double lr, int64_t step, double grad_scale) override {
    opt_.update(stage_.params(), stage_.grads(), lr, step, grad_scale);
  }
  StageState host_state() override {
    return StageState{stage_.params(), opt_.m().data(), opt_.v().data()};
  }
  void load_state(const float* params, const float* m, const float* v) override {
    const size_t n = static_cast<size_t>(param_storage());
    std::memcpy(stage_.params(), params, n * sizeof(float));
    std::memcpy(opt_.m().data(), m, n * sizeof(float));
    std::memcpy(opt_.v().data(), v, n * sizeof(float));
  }

 private:
  GptStage<float> stage_;
  AdamWOptimizer<float> opt_;
  int64_t bt_c_;
  std::vector<std::vector<float>> grad_out_;
  std::vector<float> grad_in_;
  double loss_sum_ = 0;
};

}  // namespace

std::unique_ptr<StageBackend> make_host_backend(const GptConfig& cfg, const StageRange& range,
                                                int64_t micro_batch, int slots,
                                                const AdamWSettings& adam) {
  return std::make_unique<HostStageBackend>(cfg, range, micro_batch, slots, adam);
}

}  // namespace mpiformer
