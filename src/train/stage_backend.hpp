// What the trainer needs from the pipeline stage it runs, whichever device
// runs it: the host (CBLAS/Kokkos kernels) or a GPU (fp32 or bf16). One
// implementation, TrainingStage<Ops>, serves both. The trainer walks the schedule, moves
// messages and reduces gradients through this interface only, so every
// layout, schedule, checkpoint and signal path is the same code on both.
//
// Pointers it returns (activations, gradients) live where the back end
// computes: host memory, or device memory for the GPU; communicators of the
// matching kind (MPI, or NCCL) move them. Messages are byte ranges because
// activations may be bf16.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/gpt_config.hpp"
#include "model/parameter_table.hpp"
#include "model/gpt_stage.hpp"
#include "model/shard_plan.hpp"
#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train/adamw_state.hpp"
#include "train/checkpointing.hpp"
#include "train/tensor_group.hpp"

namespace mpiformer {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

// Everything a back end's stage is built from besides the model.
struct StageSetup {
  StageOptions options;  // micro-batch, slots, recompute, ZeRO's windows
  AdamWSettings adam;
  int zero = 0;          // [parallel] zero
  int dp = 1, dp_rank = 0;
  // Buffers the input-gradient sends take turns in (pipeline_schedule.hpp's
  // gradient_send_buffers; 0 where the stage sends none).
  int grad_send_buffers = 0;
  double bucket_bytes = 25.0 * (1 << 20);  // zero 0's reduction buckets ([parallel] bucket_mb)
  Precision precision = Precision::kFp32;  // the op set's types (core/precision_plan.hpp)
  OffloadSetup offload;  // where the optimizer's moments live ([train] offload)
  GradCompression grad_compression = GradCompression::kNone;  // zero 0's all-reduce
  GradDtype grad_dtype = GradDtype::kFp32;  // ZeRO's 16-bit gradients ([train] grad_dtype)
};


class StageBackend {
 public:
  virtual ~StageBackend() = default;
  virtual const ParameterTable& table() const = 0;
  virtual const StageRange& range() const = 0;
  virtual int num_slots() const = 0;
  virtual int64_t param_storage() const = 0;
  // One [B,T,C] activation or activation gradient, in bytes.
  virtual size_t message_bytes() const = 0;
  // "cpu fp32", "cuda bf16 (NVIDIA H200, device 0)", ...
  virtual std::string describe() = 0;
  virtual bool on_device() const = 0;
  // The device allocator's peak (bytes of mpiformer's device buffers at
  // once; GPU runs), -1 on the host (its resident memory is read instead).
  virtual double device_peak_bytes() const { return -1; }
  // The CUDA stream the stage computes on (a cudaStream_t), null on the host.
  virtual void* device_stream() { return nullptr; }
  // Called while the host waits for the device (GPU runs): a failure
  // elsewhere it reports (by throwing) ends the wait.
  virtual void set_wait_check(std::function<void()> check) = 0;
  // FLOP/s of this back end's matmuls at their best, measured now (MFU's
  // denominator): a large sgemm on the host, a cuBLASLt GEMM of the run's
  // precision on a GPU.
  virtual double measure_peak_flops() = 0;
  // Seconds spent in matrix products on this thread since the last
  // host::reset_gemm_seconds(); NaN where not measured (a GPU, whose
  // products run asynchronously).
  virtual double gemm_seconds() const = 0;
  virtual void reset_gemm_seconds() = 0;

  virtual void init_parameters(uint64_t seed) = 0;
  virtual void zero_grads() = 0;

  // The data-parallel reduction and the optimizer state are the stage's
  // (train/stage_optimizer.hpp), whatever the ZeRO stage: connect_data_
  // parallel (once the groups exist) gives it its group; backward starts
  // the reduction from the step's last micro-batch; finish_reduction waits
  // for it, sums the tied embedding's copies and the gradients of kv heads
  // shared by tensor ranks (`kv`: null where none are; returns the seconds
  // waited); grad_sum_of_squares is this rank's share of the norm; and
  // adamw_step updates what this rank owns (and under ZeRO gathers the
  // weights).
  virtual int zero() const = 0;
  virtual int num_buckets() const = 0;  // zero 0's reduction buckets
  // `experts`: where the experts' gradients are reduced under expert
  // parallelism (the dp / ep replicas holding the same experts; null: dp).
  virtual void connect_data_parallel(Communicator& dp, Communicator* experts = nullptr) = 0;
  // Expert parallelism (range().ep > 1): the group sharing out the
  // experts, its counts through `host` (MPI), its rows through `rows` (a
  // communicator of the stage's memory); needed before the first forward.
  virtual void connect_expert_parallel(MpiCommunicator& host, Communicator& rows) = 0;
  // The tensor group (range().tp ranks, possibly one) the stage all-reduces
  // over inside forward and backward; needed before the first forward.
  virtual void connect_tensor_parallel(Communicator& tp) = 0;
  // Context parallelism (options' cp > 1): the ranks holding the other
  // chunks of the sequences (a communicator of the stage's memory);
  // needed before the first forward.
  virtual void connect_context_parallel(Communicator& cp, ContextChunks order) = 0;
  virtual void observe_tensor_reductions(TensorOpObserver observer) = 0;
  // Zero-bubble schedules (StageOptions::split_backward): backward computes
  // B, this W (model/gpt_stage.hpp); `chunk` as for forward.
  virtual void weight_gradients(int slot, bool last_micro_batch, int chunk) = 0;
  virtual double finish_reduction(Communicator* tied, Communicator* kv) = 0;
  // Each gradient element counted once over the job: without the tied
  // wte's copy on the last stage, without the tensors a tensor group
  // replicates on its ranks other than 0.
  virtual double grad_sum_of_squares(bool without_tied_wte, bool without_replicated) = 0;
  // Test hook: StageOptimizer::make_gradient_nonfinite.
  virtual void make_gradient_nonfinite() = 0;
  // Bytes sent to the data-parallel group by the stage's collectives since
  // the last call (ring model).
  virtual double take_sent_bytes() = 0;

  // Where a non-first stage receives its input for `slot`.
  virtual void* input_buffer(int slot) = 0;
  virtual const void* output(int slot) const = 0;
  // Where a non-last stage receives the gradient of its output.
  virtual void* output_grad_buffer() = 0;
  // tokens/targets [B,T] are host memory (the first stage reads tokens, the
  // last targets). The loss sum accumulates inside until take_loss_sum().
  // `chunk`: which of an interleaved stage's chunks (GptStage::forward).
  // `positions` [B,T] (host): [data] document_mask's positions of the
  // tokens in their documents, which every stage reads (nullptr without).
  virtual void forward(int slot, const int32_t* tokens, const int32_t* targets,
                       bool for_backward, float grad_scale, int chunk,
                       const int32_t* positions = nullptr) = 0;
  // `last_micro_batch`: the step's last, whose backward finishes the
  // gradients (the data-parallel reduction starts from it).
  virtual void backward(int slot, bool last_micro_batch, int chunk) = 0;
  // The input gradient of the last backward, copied into send buffer
  // `buffer` (of grad_send_buffers()), which stays untouched until the
  // caller hands it out again (once the send from it completed).
  virtual int grad_send_buffers() const = 0;
  // [train] grad_compression's residuals, carried from step to step: a
  // host copy (empty where none), loaded back, or forgotten (a skipped
  // update, a restore under another layout).
  virtual std::vector<float> compression_state() { return {}; }
  virtual void load_compression_state(const std::vector<float>&) {}
  virtual void forget_compression_state() {}
  virtual const void* input_grad_for_send(int buffer) = 0;
  // Sum of the per-token losses since the last call (waits for the device).
  virtual double take_loss_sum() = 0;
  // A Mixture of Experts' routing since the last call, added into totals
  // and load (GptStage::take_router_stats); nothing for a dense model.
  virtual void take_router_stats(double* totals, double* load) = 0;

  // Gradients (flat, table order) where the back end keeps them.
  virtual float* grads() = 0;
  virtual void adamw_step(double lr, int64_t step, double grad_scale) = 0;

  // Parameters and moments in host memory (copied from the device when
  // needed): valid until the next call. load_state copies them in (null
  // moments: left at zero). Under
  // ZeRO they are this rank's shard (state.shards says how it is cut),
  // state_size() elements each.
  virtual StageState host_state() = 0;
  // Where a restore may write part k of the state (0: AdamW's m, 1: v,
  // 2: the masters) itself: offloaded state's host memory or a view of
  // its file (so a resume never holds a second whole copy of it); null
  // where load_state copies.
  virtual float* state_in_place(int k) = 0;
  // Done with what host_state() returned: offloaded state's views of its
  // files are written back and dropped from memory.
  virtual void release_host_state() {}
  // Done with [p, p + n) of a view of offloaded state (host_state's or
  // state_in_place's): its pages leave the process's memory (their data
  // stays in the file); anything else is left as it is.
  virtual void drop_state_pages(const float* /*p*/, int64_t /*n*/) {}
  // Bytes of optimizer state outside the back end's memory ([train]
  // offload: host memory or disk), and the files holding it (null: none).
  virtual double offloaded_bytes() = 0;
  virtual const OffloadFiles* offload_files() = 0;
  virtual void load_state(const float* params, const float* m, const float* v) = 0;
  virtual int64_t state_size() const = 0;
  virtual const ShardPlan* shard_plan() const = 0;
};

// The back ends' factories (each in its own file, the GPU one in CUDA
// builds only); backend_factory.hpp chooses between them.
std::unique_ptr<StageBackend> make_host_backend(const GptConfig& cfg, const StageRange& range,
                                                const StageSetup& setup);
std::unique_ptr<StageBackend> make_cuda_backend(const GptConfig& cfg, const StageRange& range,
                                                const StageSetup& setup, int gpu);

}  // namespace mpiformer
