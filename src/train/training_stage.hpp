// The one implementation of StageBackend: a device's context, the GptStage
// on it, what holds its optimizer state and reduces its gradients
// (stage_optimizer.hpp: the whole state, or under ZeRO the rank's shard),
// and the buffers that hold a micro-batch's input gradient until its send
// completes.
// Instantiated for the host (host_stage_backend.cpp) and the GPU
// (cuda_stage_backend.cpp); nothing in it depends on the device beyond the
// op set.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt_stage.hpp"
#include "train/context_attention.hpp"
#include "train/expert_group.hpp"
#include "train/replicated_state.hpp"
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
        adam_(setup.adam) {
    for (int b = 0; b < setup.grad_send_buffers; ++b)
      grad_out_.emplace_back(static_cast<size_t>(stage_.activation_size()));
    if (setup.zero > 0) {
      opt_ = std::make_unique<ZeroShards<Ops>>(stage_, setup.zero, setup.dp, setup.dp_rank,
                                               setup.offload, setup.grad_dtype);
    } else {
      opt_ = std::make_unique<ReplicatedState<Ops>>(stage_, setup.bucket_bytes, setup.dp_rank,
                                                    setup.offload, setup.grad_compression);
    }
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

  void init_parameters(uint64_t seed) override { opt_->init(seed); }
  void zero_grads() override { opt_->zero_grads(); }

  int zero() const override { return opt_->zero(); }
  int num_buckets() const override { return opt_->num_buckets(); }
  void connect_data_parallel(Communicator& dp, Communicator* experts) override {
    opt_->connect(dp, experts);
  }
  void connect_expert_parallel(MpiCommunicator& host, Communicator& rows) override {
    stage_.set_expert_group(expert_group(host, rows, &observer_));
  }
  void connect_tensor_parallel(Communicator& tp) override {
    stage_.set_tensor_group(tensor_group(tp, &observer_));
  }
  void connect_context_parallel(Communicator& cp, ContextChunks order) override {
    context_ = std::make_unique<ContextAttention<Ops>>(ctx_, cp, stage_.config(), stage_.range().tp,
                                                      stage_.options().micro_batch, order, &observer_);
    stage_.set_context_group(context_->group());
  }
  void observe_tensor_reductions(TensorOpObserver observer) override {
    observer_ = std::move(observer);
  }
  void weight_gradients(int slot, bool last_micro_batch, int chunk) override {
    opt_->weight_gradients(slot, last_micro_batch, chunk);
  }
  double finish_reduction(Communicator* tied, Communicator* kv) override {
    const double waited = opt_->finish(tied);
    if (kv == nullptr) return waited;
    // Part of the tensor group's traffic: a ring all-reduce of b bytes
    // sends 2 b (g - 1) / g per rank.
    const auto t0 = std::chrono::steady_clock::now();
    const double n = static_cast<double>(opt_->sum_shared_rows(*kv)), g = kv->size();
    if (observer_)
      observer_("kv-head gradient sum", t0, std::chrono::steady_clock::now(),
                2 * n * sizeof(Acc) * (g - 1) / g);
    return waited;
  }
  void make_gradient_nonfinite() override { opt_->make_gradient_nonfinite(); }
  double grad_sum_of_squares(bool without_tied_wte, bool without_replicated) override {
    return opt_->grad_sum_of_squares(without_tied_wte, without_replicated);
  }
  double take_sent_bytes() override { return opt_->take_sent_bytes(); }
  void* input_buffer(int slot) override { return stage_.input_buffer(slot); }
  const void* output(int slot) const override { return stage_.output(slot); }
  void* output_grad_buffer() override { return stage_.output_grad_buffer(); }
  void forward(int slot, const int32_t* tokens, const int32_t* targets, bool for_backward,
               float grad_scale, int chunk, const int32_t* positions = nullptr) override {
    stage_.forward(slot, tokens, targets, for_backward, static_cast<Acc>(grad_scale), chunk,
                   positions);
  }
  void backward(int slot, bool last_micro_batch, int chunk) override {
    opt_->backward(slot, last_micro_batch, chunk);
  }
  int grad_send_buffers() const override { return static_cast<int>(grad_out_.size()); }
  std::vector<float> compression_state() override {
    std::vector<float> out;
    if (BucketReduction* c = opt_->compression()) {
      for (const auto& [p, n] : c->residuals()) {
        out.resize(out.size() + static_cast<size_t>(n));
        Ops::download(ctx_, out.data() + out.size() - n, p, n);
      }
    }
    return out;
  }
  void load_compression_state(const std::vector<float>& state) override {
    BucketReduction* c = opt_->compression();
    if (c == nullptr) return;
    int64_t at = 0;
    for (const auto& [p, n] : c->residuals()) {
      if (at + n > static_cast<int64_t>(state.size()))
        throw std::logic_error("load_compression_state: fewer residuals than the stage holds");
      Ops::upload(ctx_, p, state.data() + at, n);
      at += n;
    }
  }
  void forget_compression_state() override {
    if (BucketReduction* c = opt_->compression()) c->forget();
  }
  const void* input_grad_for_send(int buffer) override {
    Act* dst = grad_out_.at(static_cast<size_t>(buffer)).get();
    Ops::copy(ctx_, dst, stage_.input_grad(), stage_.activation_size());
    return dst;
  }
  double take_loss_sum() override { return stage_.take_loss_sum(); }
  void take_router_stats(double* totals, double* load) override {
    stage_.take_router_stats(totals, load);
  }

  float* grads() override { return stage_.grads(); }
  void adamw_step(double lr, int64_t step, double grad_scale) override {
    opt_->adamw(AdamWParams{lr, adam_.beta1, adam_.beta2, adam_.eps, adam_.weight_decay, step,
                            grad_scale});
  }

  StageState host_state() override {
    Acc* params = opt_->master();
    Acc* m = opt_->adam_m();
    Acc* v = opt_->adam_v();
    const ShardPlan* shards = shard_plan();
    // fp32 at zero 1-2: the masters are the stage's whole weights.
    const bool whole = opt_->masters_are_weights();
    // Offloaded state in files is read through views: each pass drops
    // what it read.
    std::function<void(const float*, int64_t)> done_with;
    if (opt_->moments().files() != nullptr)
      done_with = [this](const float* p, int64_t n) { drop_state_pages(p, n); };
    if constexpr (Ops::kHostMemory) {
      return StageState{params, m, v, shards, whole, done_with};
    } else {
      const int64_t n = state_size(), np = whole ? stage_.param_storage() : n;
      if (!opt_->moments().holds_masters()) {
        params = download_state(host_params_, params, np);
      }
      if (opt_->moments().in_host_memory()) {
        return StageState{params, m, v, shards, whole, done_with};  // offloaded
      }
      m = download_state(host_m_, m, n);
      v = download_state(host_v_, v, n);
      // Copies that no step writes: a background save writes from them
      // as they are (the next host_state() comes after it is done).
      return StageState{params, m, v, shards, whole, {}, /*detached=*/true};
    }
  }
  void release_host_state() override { opt_->moments().release_views(); }
  void drop_state_pages(const float* p, int64_t n) override { opt_->moments().drop_pages(p, n); }
  float* state_in_place(int k) override {
    if constexpr (std::is_same_v<Acc, float>) {
      AdamWState<Ops>& state = opt_->moments();
      if (k == 2) return state.master();  // null unless held
      if (state.where() != Offload::kNone) return state.moment(k);
    }
    return nullptr;
  }
  double offloaded_bytes() override { return opt_->moments().offloaded_bytes(); }
  const OffloadFiles* offload_files() override { return opt_->moments().files(); }
  // Null moments start at zero (a fresh run from pretrained weights).
  void load_state(const float* params, const float* m, const float* v) override {
    opt_->load(params, m, v);
  }
  int64_t state_size() const override { return opt_->state_size(); }
  const ShardPlan* shard_plan() const override { return opt_->shard_plan(); }

 private:
  typename Ops::Context ctx_;
  GptStage<Ops> stage_;
  AdamWSettings adam_;
  std::vector<Buffer<Act>> grad_out_;
  std::unique_ptr<StageOptimizer<Ops>> opt_;
  TensorOpObserver observer_;  // the tensor group keeps its address
  std::unique_ptr<ContextAttention<Ops>> context_;  // cp > 1
  // Device runs only: the state copied down for a save, in page-locked
  // memory (a pageable copy is staged through the driver's own buffer at
  // a fraction of the link's rate), kept for the next save.
  using HostFloats = typename Ops::template HostBuffer<float>;
  HostFloats host_params_, host_m_, host_v_;
  float* download_state(HostFloats& to, const float* from, int64_t n) {
    if (to.size() != static_cast<size_t>(n)) to = HostFloats(static_cast<size_t>(n));
    Ops::download(ctx_, to.get(), from, n);
    return to.get();
  }
};

}  // namespace mpiformer
