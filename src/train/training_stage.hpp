// The one implementation of StageBackend: a device's context, the GptStage
// on it, the AdamW moments and the optimizer's chunk list (or, under ZeRO,
// the rank's shard of them: zero_shards.hpp), and the buffers that hold a
// micro-batch's input gradient until its send completes.
// Instantiated for the host (host_stage_backend.cpp) and the GPU
// (cuda_stage_backend.cpp); nothing in it depends on the device beyond the
// op set.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt_stage.hpp"
#include "train/stage_backend.hpp"
#include "train/tensor_group.hpp"
#include "train/zero_shards.hpp"

namespace mpiformer {

template <class Ops>
class TrainingStage final : public StageBackend {
 public:
  using Act = typename Ops::Act;
  using Acc = typename Ops::Acc;
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;

  template <class... ContextArgs>
  TrainingStage(const GptConfig& cfg, const StageRange& range, const StageSetup& setup,
                ContextArgs&&... context_args)
      : ctx_(std::forward<ContextArgs>(context_args)...),
        stage_(ctx_, cfg, range, setup.options),
        adam_(setup.adam),
        zero_level_(setup.zero) {
    if (!range.has_embedding || range.chunks > 1)
      for (int s = 0; s < setup.options.slots; ++s)
        grad_out_.emplace_back(static_cast<size_t>(stage_.activation_size()));
    if (setup.zero > 0) {
      zero_ = std::make_unique<ZeroShards<Ops>>(stage_, setup.zero, setup.dp, setup.dp_rank);
      return;
    }
    m_ = Buffer<Acc>(static_cast<size_t>(stage_.param_storage()));
    v_ = Buffer<Acc>(static_cast<size_t>(stage_.param_storage()));
    Ops::fill_zero(ctx_, m_.get(), stage_.param_storage());
    Ops::fill_zero(ctx_, v_.get(), stage_.param_storage());
    const std::vector<AdamWChunk> chunks = adamw_chunks(stage_.table());
    chunk_count_ = static_cast<int64_t>(chunks.size());
    chunks_ = Buffer<AdamWChunk>(chunks.size());
    Ops::upload(ctx_, chunks_.get(), chunks.data(), chunk_count_);
  }

  const ParameterTable& table() const override { return stage_.table(); }
  const StageRange& range() const override { return stage_.range(); }
  int num_slots() const override { return stage_.num_slots(); }
  int64_t param_storage() const override { return stage_.param_storage(); }
  size_t message_bytes() const override {
    return sizeof(Act) * static_cast<size_t>(stage_.activation_size());
  }
  std::string describe() override { return Ops::describe(ctx_); }
  bool on_device() const override { return !Ops::kHostMemory; }
  double device_peak_bytes() const override {
    if constexpr (Ops::kHostMemory) return -1;
    else return Ops::allocated_peak_bytes();
  }
  void* device_stream() override { return Ops::stream_handle(ctx_); }
  void set_wait_check(std::function<void()> check) override {
    Ops::set_wait_check(ctx_, std::move(check));
  }
  double measure_peak_flops() override { return Ops::measure_peak_flops(ctx_); }
  double gemm_seconds() const override { return Ops::gemm_seconds(); }
  void reset_gemm_seconds() override { Ops::reset_gemm_seconds(); }

  void init_parameters(uint64_t seed) override {
    if (!zero_) return stage_.init_parameters(seed);
    // Every rank draws each tensor whole (the same values everywhere), one
    // at a time, and keeps its rows (the shard's other elements, padding,
    // stay zero); the weights are gathered once the group exists.
    const ShardPlan& plan = zero_->plan();
    std::vector<float> tensor;
    for (const auto& spec : stage_.table().specs()) {
      tensor.resize(static_cast<size_t>(spec.storage));
      fill_initial_tensor(spec, seed, tensor.data());
      const TensorPart p = plan.part_of(spec);
      zero_->upload_master(spec, p, tensor.data() + p.row_begin * spec.row_length());
    }
    zero_->loaded();
  }
  void zero_grads() override {
    stage_.zero_grads();
    if (zero_) zero_->zero_grads();
  }

  int zero() const override { return zero_level_; }
  void connect_data_parallel(Communicator& dp) override {
    if (zero_) zero_->connect(dp);
  }
  void connect_tensor_parallel(Communicator& tp) override {
    stage_.set_tensor_group(tensor_group(tp, &observer_));
  }
  void observe_tensor_reductions(TensorOpObserver observer) override {
    observer_ = std::move(observer);
  }
  void backward_sharded(int slot, bool last_micro_batch, int chunk) override {
    zero_->backward(slot, last_micro_batch, chunk);
  }
  void weight_gradients(int slot, const GradsFinal& grads_final, int chunk) override {
    stage_.weight_gradients(slot, grads_final, chunk);
  }
  void weight_gradients_sharded(int slot, bool last_micro_batch, int chunk) override {
    zero_->weight_gradients(slot, last_micro_batch, chunk);
  }
  double finish_sharded_reduction(Communicator* tied) override { return zero_->finish(tied); }
  double sharded_grad_sum_of_squares(bool without_tied_wte, bool without_replicated) override {
    return zero_->grad_sum_of_squares(without_tied_wte, without_replicated);
  }
  double take_sent_bytes() override { return zero_ ? zero_->take_sent_bytes() : 0.0; }
  void* input_buffer(int slot) override { return stage_.input_buffer(slot); }
  const void* output(int slot) const override { return stage_.output(slot); }
  void* output_grad_buffer() override { return stage_.output_grad_buffer(); }
  void forward(int slot, const int32_t* tokens, const int32_t* targets, bool for_backward,
               float grad_scale, int chunk) override {
    stage_.forward(slot, tokens, targets, for_backward, static_cast<Acc>(grad_scale), chunk);
  }
  void backward(int slot, const GradsFinal& grads_final, int chunk) override {
    stage_.backward(slot, grads_final, chunk);
  }
  const void* input_grad_for_send(int slot) override {
    Act* dst = grad_out_[slot].get();
    Ops::copy(ctx_, dst, stage_.input_grad(), stage_.activation_size());
    return dst;
  }
  double take_loss_sum() override { return stage_.take_loss_sum(); }

  float* grads() override { return stage_.grads(); }
  double grad_sum_of_squares(int64_t offset, int64_t n) override {
    return Ops::sum_of_squares(ctx_, stage_.grads() + offset, n);
  }
  double replicated_grad_sum_of_squares() override {
    double s = 0;
    for (const auto& spec : stage_.table().specs())
      if (spec.whole()) s += grad_sum_of_squares(spec.offset, spec.numel());
    return s;
  }
  void adamw_step(double lr, int64_t step, double grad_scale) override {
    const AdamWParams p{lr, adam_.beta1, adam_.beta2, adam_.eps, adam_.weight_decay, step,
                        grad_scale};
    if (zero_) return zero_->adamw(p);
    Ops::adamw(ctx_, stage_.params(), stage_.grads(), m_.get(), v_.get(), chunks_.get(),
               chunk_count_, p, stage_.weights());
  }

  StageState host_state() override {
    Acc* params = zero_ ? zero_->master() : stage_.params();
    Acc* m = zero_ ? zero_->adam_m() : m_.get();
    Acc* v = zero_ ? zero_->adam_v() : v_.get();
    const ShardPlan* shards = shard_plan();
    // fp32 at zero 1-2: the masters are the stage's whole weights.
    const bool whole = zero_ && zero_->masters_are_weights();
    if constexpr (Ops::kHostMemory) {
      return StageState{params, m, v, shards, whole};
    } else {
      const int64_t n = state_size(), np = whole ? stage_.param_storage() : n;
      host_params_.resize(static_cast<size_t>(np));
      for (auto* h : {&host_m_, &host_v_}) h->resize(static_cast<size_t>(n));
      Ops::download(ctx_, host_params_.data(), params, np);
      Ops::download(ctx_, host_m_.data(), m, n);
      Ops::download(ctx_, host_v_.data(), v, n);
      return StageState{host_params_.data(), host_m_.data(), host_v_.data(), shards, whole};
    }
  }
  void load_state(const float* params, const float* m, const float* v) override {
    if (zero_) return zero_->load(params, m, v);
    // Null moments start at zero (a fresh run from pretrained weights).
    const int64_t n = stage_.param_storage();
    Ops::upload(ctx_, stage_.params(), params, n);
    if (m != nullptr) Ops::upload(ctx_, m_.get(), m, n);
    if (v != nullptr) Ops::upload(ctx_, v_.get(), v, n);
    stage_.refresh_weights();
  }
  int64_t state_size() const override {
    return zero_ ? zero_->plan().shard_size() : stage_.param_storage();
  }
  const ShardPlan* shard_plan() const override { return zero_ ? &zero_->plan() : nullptr; }

 private:
  typename Ops::Context ctx_;
  GptStage<Ops> stage_;
  AdamWSettings adam_;
  int zero_level_;
  Buffer<Acc> m_, v_;
  Buffer<AdamWChunk> chunks_;
  int64_t chunk_count_ = 0;
  std::vector<Buffer<Act>> grad_out_;
  std::unique_ptr<ZeroShards<Ops>> zero_;  // zero >= 1
  TensorOpObserver observer_;  // the tensor group keeps its address
  std::vector<float> host_params_, host_m_, host_v_;  // device runs only
};

}  // namespace mpiformer
