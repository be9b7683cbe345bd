// One pipeline stage of GPT-2 on a GPU: the twin of GptStage (same tensors,
// same order of operations, same parameter table) with device buffers and
// the kernels of kernels/cuda. `A` is the activation type: float, or bf16
// for mixed precision, where activations and the weights the matmuls read
// are bf16 while the master weights, their gradients and the loss are float.
//
// Everything runs on one CUDA stream owned by the stage; nothing is copied
// between host and device during forward or backward except the tokens
// going in. Buffers are planned once at construction, as on the host.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cuda/device.hpp"
#include "cuda/embedding.hpp"
#include "cuda/gemm.hpp"
#include "model/gpt_config.hpp"
#include "model/parameter_table.hpp"
#include "model/stage_layout.hpp"

namespace mpiformer {

template <class A>
class CudaGptStage {
 public:
  CudaGptStage(const GptConfig& cfg, const StageRange& range, int64_t micro_batch, int num_slots);
  ~CudaGptStage();
  CudaGptStage(const CudaGptStage&) = delete;
  CudaGptStage& operator=(const CudaGptStage&) = delete;

  cudaStream_t stream() const { return stream_; }
  const GptConfig& config() const { return cfg_; }
  const StageRange& range() const { return range_; }
  const ParameterTable& table() const { return table_; }
  int num_slots() const { return static_cast<int>(slots_.size()); }
  int64_t param_storage() const { return table_.total_storage(); }

  // Master weights and gradients (float, device memory, table order).
  float* params() { return params_.get(); }
  float* grads() { return grads_.get(); }
  // The weights the matmuls read: params() itself in fp32, a bf16 copy
  // otherwise. refresh_weights() re-derives it after params() changed
  // outside AdamW (initialisation, restore).
  A* weights() { return weights_; }
  void refresh_weights();
  // Same values as GptStage::init_parameters (drawn on the host, uploaded).
  void init_parameters(uint64_t seed);
  void zero_grads();

  A* input_buffer(int slot) { return slots_[slot].residual[0].get(); }
  // tokens, targets: host [B,T]. The loss sum accumulates on the device.
  void forward(int slot, const int32_t* tokens, const int32_t* targets, bool for_backward,
               float grad_scale);
  const A* output(int slot) const { return slots_[slot].residual.back().get(); }
  using GradsFinal = std::function<void(int64_t offset)>;
  // Non-last stages read the output gradient from dout (device [B,T,C]).
  void backward(int slot, const A* dout, const GradsFinal& grads_final = nullptr);
  const A* input_grad() const { return dres_.get(); }
  // Sum of per-token losses since the last call; synchronises the stream.
  double take_loss_sum();
  // Device [B*T, Vp] logits (or their gradient after a for_backward
  // forward) and [B*T] losses of `slot`, for tests.
  const A* logits(int slot) const { return slots_[slot].logits.get(); }
  const float* losses(int slot) const { return slots_[slot].losses.get(); }

 private:
  template <class T>
  using Buf = cuda::DeviceBuffer<T>;
  struct LayerActs {
    Buf<A> ln1, qkv, atty, att, res2, ln2, fch, fch_gelu;
    Buf<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
  };
  struct Slot {
    std::vector<Buf<A>> residual;  // [layers + 1][B*T*C]
    std::vector<LayerActs> layers;
    Buf<A> lnf, logits;
    Buf<float> lnf_mean, lnf_rstd, losses;
    Buf<int32_t> tokens, targets, group_tokens, group_starts, group_positions;
    int64_t groups = 0;
  };

  GptConfig cfg_;
  StageRange range_;
  ParameterTable table_;
  int64_t B_, T_;
  StageLayout at_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Blas> blas_;
  Buf<float> params_, grads_;
  Buf<A> weight_copy_;  // bf16 only
  A* weights_ = nullptr;
  std::vector<Slot> slots_;
  Buf<A> dres_, dln_, datty_, dqkv_, d4_, datt_, scratch_qkv_, scratch_y_, scratch_dqkv_;
  Buf<double> loss_sum_, reduce_scratch_;
  cuda::TokenGroups groups_host_;
};

extern template class CudaGptStage<float>;
extern template class CudaGptStage<cuda::bf16>;

}  // namespace mpiformer
