// What holds one stage's optimizer state and reduces its gradients over
// the stage's data-parallel group, whatever the ZeRO stage: the replicated
// state of zero 0 (replicated_state.hpp: whole moments, bucketed
// all-reduces) or a shard of it (zero_shards.hpp: reduce-scatters,
// gathers). The training stage owns one and routes its backward through
// it, so the step is the same walk for every zero stage; where the state
// lives is the implementation's business: the masters and gradients in the
// back end's memory, the moments wherever [train] offload says.
#pragma once
#include <cstdint>

#include "common/adamw_params.hpp"
#include "model/parameter_table.hpp"
#include "model/shard_plan.hpp"
#include "parallel/communicator.hpp"
#include "train/adamw_state.hpp"
#include "train/grad_reducer.hpp"

namespace mpiformer {

template <class Ops>
class StageOptimizer {
 public:
  using Acc = typename Ops::Acc;
  virtual ~StageOptimizer() = default;

  // The group (once it exists); weights pending publication follow.
  // `experts` (zero 0): where the experts' buckets are reduced under
  // expert parallelism (null: dp).
  virtual void connect(Communicator& dp, Communicator* experts = nullptr) = 0;
  // GPT-2's initial weights (model/stage_layout.hpp: the same on every
  // rank and layout), into the masters and the weights.
  virtual void init(uint64_t seed) = 0;
  // A step begins.
  virtual void zero_grads() = 0;
  // One micro-batch's backward of `slot` (of model chunk `chunk`); `last`:
  // the step's last micro-batch, whose backward finishes the gradients
  // (the reduction starts from it). Under split backward, B and W.
  virtual void backward(int slot, bool last, int chunk) = 0;
  virtual void weight_gradients(int slot, bool last, int chunk) = 0;
  // Waits for the step's reduction, sums the tied embedding's copies
  // (`tied`: the pair, null where none); the seconds the step waited for
  // the data-parallel group so far (here, and wherever its forward or
  // backward stood still for it: a free slot, a gather).
  virtual double finish(Communicator* tied) = 0;
  // After finish: sums over `kv` (the tensor ranks sharing this rank's kv
  // heads, GptConfig::kv_share) the gradient rows of those heads this rank
  // owns, which each rank computed from its own query heads only; the
  // elements summed.
  virtual int64_t sum_shared_rows(Communicator& kv) = 0;
  // This rank's share of the squared gradient norm: each element counted
  // once over the job (without the tied wte's second copy, without the
  // tensors a tensor group replicates on its ranks other than 0, without
  // the shared kv heads' rows on their ranks other than the first).
  virtual double grad_sum_of_squares(bool without_tied_wte, bool without_replicated) = 0;
  // Test hook (MPIFORMER_FAULT_NONFINITE_STEP): one gradient the norm reads
  // becomes NaN, as a numerical fault would make it (host memory only).
  virtual void make_gradient_nonfinite() = 0;
  // Bytes sent to the data-parallel group since the last call (ring model).
  virtual double take_sent_bytes() = 0;
  virtual void adamw(const AdamWParams& p) = 0;

  // The state where it lives: master weights (null: the stage's weights
  // are the masters) and the moments, each state_size() elements, cut as
  // shard_plan() says (null: the stage's whole flat buffer).
  virtual Acc* master() = 0;
  virtual Acc* adam_m() = 0;
  virtual Acc* adam_v() = 0;
  virtual bool masters_are_weights() const = 0;
  // Where the moments live, and their update (adamw_state.hpp).
  virtual AdamWState<Ops>& moments() = 0;
  virtual int64_t state_size() const = 0;
  virtual const ShardPlan* shard_plan() const = 0;
  // From host memory (null moments: zero).
  virtual void load(const float* master, const float* m, const float* v) = 0;
  // What the summary says of the reduction ("3 gradient bucket(s)").
  virtual int zero() const = 0;
  virtual int num_buckets() const { return 0; }
  // [train] grad_compression's state carried over steps (null: none).
  virtual BucketReduction* compression() { return nullptr; }
};

}  // namespace mpiformer
