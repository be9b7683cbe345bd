// The GPU back end: CudaGptStage in fp32 or bf16 and a fused AdamW over
// device-resident float master weights and moments.
#include <cuda_runtime.h>

#include <vector>

#include "core/format.hpp"
#include "cuda/adamw.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/gemm.hpp"
#include "cuda/reduce.hpp"
#include "model/gpt_stage_cuda.hpp"
#include "train/stage_backend.hpp"

namespace mpiformer {

namespace {

template <class A>
class CudaStageBackend final : public StageBackend {
 public:
  CudaStageBackend(const GptConfig& cfg, const StageRange& range, int64_t micro_batch, int slots,
                   const AdamWSettings& adam, const BackendChoice& c)
      : stage_(cfg, range, micro_batch, slots),
        adam_(adam),
        bt_c_(micro_batch * cfg.seq_len * cfg.n_embd),
        m_(stage_.param_storage()),
        v_(stage_.param_storage()),
        scalar_(1),
        scratch_(cuda::kReduceBlocks) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, c.gpu));
    description_ = strprintf("cuda %s (%s, device %d)", c.precision.c_str(), prop.name, c.gpu);
    const size_t bytes = sizeof(float) * static_cast<size_t>(stage_.param_storage());
    CUDA_CHECK(cudaMemsetAsync(m_.get(), 0, bytes, stream()));
    CUDA_CHECK(cudaMemsetAsync(v_.get(), 0, bytes, stream()));
    if (!range.has_embedding)
      for (int s = 0; s < slots; ++s) grad_out_.emplace_back(bt_c_);
    if (!range.has_head) grad_in_ = cuda::DeviceBuffer<A>(bt_c_);
    // AdamW's work list, once: only logical elements (wte's padded rows stay
    // zero), decay by tensor as on the host.
    std::vector<cuda::AdamWChunk> chunks;
    for (const auto& spec : stage_.table().specs())
      cuda::append_adamw_chunks(chunks, spec.offset, spec.numel(),
                                spec.decay ? adam_.weight_decay : 0.0);
    chunks_ = cuda::DeviceBuffer<cuda::AdamWChunk>(chunks.size());
    CUDA_CHECK(cudaMemcpy(chunks_.get(), chunks.data(), sizeof(cuda::AdamWChunk) * chunks.size(),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

  cudaStream_t stream() const { return stage_.stream(); }
  const ParameterTable& table() const override { return stage_.table(); }
  const StageRange& range() const override { return stage_.range(); }
  int num_slots() const override { return stage_.num_slots(); }
  int64_t param_storage() const override { return stage_.param_storage(); }
  size_t message_bytes() const override { return sizeof(A) * static_cast<size_t>(bt_c_); }
  std::string describe() const override { return description_; }
  bool on_device() const override { return true; }
  void* device_stream() override { return stream(); }
  double measure_peak_flops() override {
    return cuda::measure_gemm_peak(cuda::dtype_of<A>());
  }
  void init_parameters(uint64_t seed) override { stage_.init_parameters(seed); }
  void zero_grads() override { stage_.zero_grads(); }
  void* input_buffer(int slot) override { return stage_.input_buffer(slot); }
  const void* output(int slot) const override { return stage_.output(slot); }
  void* output_grad_buffer() override { return grad_in_.get(); }

  void forward(int slot, const int32_t* tokens, const int32_t* targets, bool for_backward,
               float grad_scale) override {
    stage_.forward(slot, tokens, targets, for_backward, grad_scale);
  }
  void backward(int slot, const int32_t*, const GradsFinal& grads_final) override {
    stage_.backward(slot, grad_in_.get(), grads_final);
  }
  const void* input_grad_for_send(int slot) override {
    A* dst = grad_out_[slot].get();
    CUDA_CHECK(cudaMemcpyAsync(dst, stage_.input_grad(), message_bytes(),
                               cudaMemcpyDeviceToDevice, stream()));
    return dst;
  }
  double take_loss_sum() override { return stage_.take_loss_sum(); }

  float* grads() override { return stage_.grads(); }
  double grad_sum_of_squares(int64_t offset, int64_t n) override {
    cuda::reduce_sum(scalar_.get(), stage_.grads() + offset, n, true, false, scratch_.get(),
                     stream());
    double out = 0;
    CUDA_CHECK(cudaMemcpyAsync(&out, scalar_.get(), sizeof out, cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    return out;
  }
  void adamw_step(double lr, int64_t step, double grad_scale) override {
    A* copy = std::is_same_v<A, float> ? nullptr : stage_.weights();
    const AdamWParams p{lr, adam_.beta1, adam_.beta2, adam_.eps, 0.0, step, grad_scale};
    cuda::adamw_update_chunks(stage_.params(), stage_.grads(), m_.get(), v_.get(), chunks_.get(),
                              static_cast<int64_t>(chunks_.size()), p, copy, stream());
  }

  StageState host_state() override {
    const size_t n = static_cast<size_t>(param_storage());
    host_params_.resize(n);
    host_m_.resize(n);
    host_v_.resize(n);
    download(host_params_.data(), stage_.params());
    download(host_m_.data(), m_.get());
    download(host_v_.data(), v_.get());
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    return StageState{host_params_.data(), host_m_.data(), host_v_.data()};
  }
  void load_state(const float* params, const float* m, const float* v) override {
    const size_t bytes = sizeof(float) * static_cast<size_t>(param_storage());
    CUDA_CHECK(cudaMemcpyAsync(stage_.params(), params, bytes, cudaMemcpyHostToDevice, stream()));
    CUDA_CHECK(cudaMemcpyAsync(m_.get(), m, bytes, cudaMemcpyHostToDevice, stream()));
    CUDA_CHECK(cudaMemcpyAsync(v_.get(), v, bytes, cudaMemcpyHostToDevice, stream()));
    stage_.refresh_weights();
    CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

 private:
  void download(float* dst, const float* src) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * static_cast<size_t>(param_storage()),
                               cudaMemcpyDeviceToHost, stream()));
  }

  CudaGptStage<A> stage_;
  AdamWSettings adam_;
  int64_t bt_c_;
  cuda::DeviceBuffer<float> m_, v_;
  cuda::DeviceBuffer<double> scalar_, scratch_;
  std::vector<cuda::DeviceBuffer<A>> grad_out_;
  cuda::DeviceBuffer<A> grad_in_;
  cuda::DeviceBuffer<cuda::AdamWChunk> chunks_;
  std::vector<float> host_params_, host_m_, host_v_;
  std::string description_;
};

}  // namespace

std::unique_ptr<StageBackend> make_cuda_backend(const GptConfig& cfg, const StageRange& range,
                                                int64_t micro_batch, int slots,
                                                const AdamWSettings& adam,
                                                const BackendChoice& c) {
  CUDA_CHECK(cudaSetDevice(c.gpu));
  if (c.precision == "bf16") {
    return std::make_unique<CudaStageBackend<cuda::bf16>>(cfg, range, micro_batch, slots, adam, c);
  }
  return std::make_unique<CudaStageBackend<float>>(cfg, range, micro_batch, slots, adam, c);
}

}  // namespace mpiformer
