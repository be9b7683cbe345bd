// zero 0: every replica of a stage holds the whole optimizer state (the
// stage's own weights are the masters, AdamW's moments beside them; or,
// offloaded in mixed precision, adamw_state.hpp holds both) and
// the whole gradients, all-reduced over the data-parallel group in buckets
// (grad_reducer.hpp) during the last micro-batch's backward, each bucket
// as soon as backward has finished it.
#pragma once
#include <limits>
#include <memory>
#include <vector>

#include "model/gpt_stage.hpp"
#include "model/stage_layout.hpp"
#include "train/compressed_allreduce.hpp"
#include "train/grad_reducer.hpp"
#include "train/stage_optimizer.hpp"

namespace mpiformer {

template <class Ops>
class ReplicatedState final : public StageOptimizer<Ops> {
 public:
  using Acc = typename Ops::Acc;
  template <class U>
  using Buffer = typename Ops::template Buffer<U>;

  // `bucket_bytes`: the reduction's bucket size; `dp_rank`: the replica
  // (replica 0 counts the gradient norm: the others hold the same sums).
  // `offload`: where the moments live (adamw_state.hpp).
  // `compression`: what the all-reduce sends (compressed_allreduce.hpp).
  ReplicatedState(GptStage<Ops>& stage, double bucket_bytes, int dp_rank,
                  const OffloadSetup& offload, GradCompression compression = GradCompression::kNone)
      : stage_(stage),
        ctx_(stage.context()),
        bucket_bytes_(bucket_bytes),
        dp_rank_(dp_rank),
        wte_(stage.table().tied_embedding()),
        moments_(stage.context(), stage.param_storage(), adamw_chunks(stage.table()), offload),
        compression_(compression) {}

  void connect(Communicator& dp, Communicator* experts) override {
    dp_ = &dp;
    reducer_ =
        std::make_unique<GradReducer>(stage_.table(), bucket_bytes_, dp, experts, Ops::kHostMemory);
    if (overlaps() && compression_ != GradCompression::kNone) {
      compressed_ = std::make_unique<CompressedAllReduce<Ops>>(
          ctx_, compression_, reducer_->buckets(), stage_.param_storage(), dp.size(),
          experts != nullptr ? experts->size() : dp.size());
      reducer_->reduce_with(compressed_.get());
    }
    // Offloaded from a GPU: each bucket comes down to the host as soon as
    // its reduction is done, while backward goes on (not compressed: a
    // bucket's floats exist only once its exchange is through).
    if (overlaps() && !compressed_ && moments_.can_prefetch_gradients()) {
      moments_.enable_gradient_prefetch();
      reducer_->on_bucket_started([this](int64_t begin, int64_t end, PendingOp& op) {
        moments_.prefetch_gradients(stage_.grads(), begin, end, op);
      });
    }
  }
  void init(uint64_t seed) override {
    if (!moments_.holds_masters()) {
      stage_.init_parameters(seed);
      return;
    }
    // Tensor by tensor into the held masters (no mapping of a whole file).
    std::vector<float> tensor;
    for (const auto& spec : stage_.table().specs()) {
      tensor.resize(static_cast<size_t>(spec.storage));
      fill_initial_tensor(spec, seed, tensor.data());
      moments_.write_range(AdamWState<Ops>::kMaster, spec.offset, spec.storage, tensor.data());
    }
    moments_.write_weights(stage_.weights());
  }
  void zero_grads() override {
    stage_.zero_grads();
    begun_ = false;
  }

  // The last micro-batch's backwards (one per chunk of an interleaved
  // stage, from the last chunk down; B and W under split backward) finish
  // the gradients from the end of the buffer: the reduction begins with
  // the first of them.
  void backward(int slot, bool last, int chunk) override {
    stage_.backward(slot, hook(last), chunk);
  }
  void weight_gradients(int slot, bool last, int chunk) override {
    stage_.weight_gradients(slot, hook(last), chunk);
  }
  double finish(Communicator* tied) override {
    double waited = 0;
    if (overlaps()) {
      waited = reducer_->finish();
      // A ring all-reduce of n bytes sends 2 n (dp - 1) / dp per rank.
      const double dp = dp_->size();
      sent_ += compressed_ ? compressed_->take_sent_bytes()
                           : 2.0 * sizeof(Acc) * static_cast<double>(stage_.param_storage()) *
                                 (dp - 1) / dp;
    }
    begun_ = false;
    // The two copies of the tied embedding receive the sum of both
    // stages' gradients, so identical updates keep them identical.
    if (tied != nullptr && wte_ != nullptr) {
      tied->allreduce_sum(stage_.grads() + wte_->offset, wte_->storage);
      moments_.gradients_changed(wte_->offset, wte_->storage);
    }
    return waited;
  }
  int64_t sum_shared_rows(Communicator& kv) override {
    int64_t n = 0;
    for (const auto& spec : stage_.table().specs()) {
      const ParameterSpec::Rows r = spec.shared_rows();
      const int64_t len = (r.end - r.begin) * spec.row_length();
      if (len == 0) continue;
      kv.allreduce_sum(stage_.grads() + spec.offset + r.begin * spec.row_length(), len);
      moments_.gradients_changed(spec.offset + r.begin * spec.row_length(), len);
      n += len;
    }
    return n;
  }
  double grad_sum_of_squares(bool without_tied_wte, bool without_replicated) override {
    // Every replica holds the same sums: replica 0 counts them; an
    // expert's (expert parallelism), the first replica holding it.
    const int64_t ep = stage_.range().ep;
    if (dp_rank_ >= ep) return 0;
    if (dp_rank_ > 0) {
      double s = 0;
      for (const auto& spec : stage_.table().specs())
        if (spec.expert >= 0 && !(without_replicated && spec.whole()))
          s += sum_of_squares(spec.offset, spec.numel());
      return s;
    }
    double s = sum_of_squares(0, stage_.param_storage());
    if (without_tied_wte && wte_ != nullptr) s -= sum_of_squares(wte_->offset, wte_->storage);
    for (const auto& spec : stage_.table().specs()) {
      if (without_replicated && spec.whole()) s -= sum_of_squares(spec.offset, spec.numel());
      const ParameterSpec::Rows r = spec.shared_rows();
      if (r.end > r.begin && !spec.owns_shared())
        s -= sum_of_squares(spec.offset + r.begin * spec.row_length(), (r.end - r.begin) * spec.row_length());
    }
    return s;
  }
  void make_gradient_nonfinite() override {
    if constexpr (Ops::kHostMemory) stage_.grads()[0] = std::numeric_limits<Acc>::quiet_NaN();
  }
  double take_sent_bytes() override {
    const double s = sent_;
    sent_ = 0;
    return s;
  }
  void adamw(const AdamWParams& p) override {
    moments_.step(stage_.params(), stage_.grads(), p, stage_.weights());  // params: null when held
  }

  Acc* master() override { return moments_.holds_masters() ? moments_.master() : stage_.params(); }
  Acc* adam_m() override { return moments_.moment(0); }
  Acc* adam_v() override { return moments_.moment(1); }
  AdamWState<Ops>& moments() override { return moments_; }
  bool masters_are_weights() const override { return false; }
  int64_t state_size() const override { return stage_.param_storage(); }
  const ShardPlan* shard_plan() const override { return nullptr; }
  void load(const float* params, const float* m, const float* v) override {
    if (moments_.holds_masters()) {
      moments_.load(params, m, v);
      moments_.write_weights(stage_.weights());
      return;
    }
    Ops::upload(ctx_, stage_.params(), params, stage_.param_storage());
    moments_.load(nullptr, m, v);
    stage_.refresh_weights();
  }
  int zero() const override { return 0; }
  BucketReduction* compression() override { return compressed_.get(); }
  int num_buckets() const override { return reducer_ ? reducer_->num_buckets() : 0; }

 private:
  bool overlaps() const { return dp_ != nullptr && dp_->size() > 1; }
  GradsFinal hook(bool last) {
    if (!last || !overlaps()) return nullptr;
    if (!begun_) {
      reducer_->begin(stage_.grads());
      moments_.prefetch_begin();
    }
    begun_ = true;
    return [this](int64_t offset) { reducer_->grads_final_from(offset); };
  }
  double sum_of_squares(int64_t offset, int64_t n) {
    return Ops::sum_of_squares(ctx_, stage_.grads() + offset, n);
  }

  GptStage<Ops>& stage_;
  typename Ops::Context& ctx_;
  double bucket_bytes_;
  int dp_rank_;
  const ParameterSpec* wte_;  // the tied embedding, where the stage holds a copy
  AdamWState<Ops> moments_;
  Communicator* dp_ = nullptr;
  GradCompression compression_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<CompressedAllReduce<Ops>> compressed_;
  bool begun_ = false;  // the step's reduction has begun
  double sent_ = 0;
};

}  // namespace mpiformer
