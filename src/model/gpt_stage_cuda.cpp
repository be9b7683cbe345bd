#include "model/gpt_stage_cuda.hpp"

#include "cuda/adamw.hpp"
#include "cuda/attention.hpp"
#include "cuda/crossentropy.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/gelu.hpp"
#include "cuda/layernorm.hpp"
#include "cuda/matmul.hpp"
#include "cuda/reduce.hpp"
#include "cuda/residual.hpp"
#include "model/stage_layout.hpp"

namespace mpiformer {

using namespace cuda;

namespace {

// Pageable host memory: the call returns once the source has been read, so
// the caller may reuse its buffer at once.
void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
}

}  // namespace

template <class A>
CudaGptStage<A>::CudaGptStage(const GptConfig& cfg, const StageRange& range, int64_t micro_batch,
                              int num_slots)
    : cfg_(cfg),
      range_(range),
      table_(cfg, range),
      B_(micro_batch),
      T_(cfg.seq_len),
      at_(table_, range_) {
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head, L = range_.num_layers();
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  blas_ = std::make_unique<Blas>(stream_);
  params_ = Buf<float>(table_.total_storage());
  grads_ = Buf<float>(table_.total_storage());
  if constexpr (std::is_same_v<A, float>) {
    weights_ = params_.get();
  } else {
    weight_copy_ = Buf<A>(table_.total_storage());
    weights_ = weight_copy_.get();
  }
  CUDA_CHECK(cudaMemsetAsync(params_.get(), 0, sizeof(float) * params_.size(), stream_));
  CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, sizeof(float) * grads_.size(), stream_));
  slots_.resize(num_slots);
  for (auto& s : slots_) {
    for (int64_t i = 0; i <= L; ++i) s.residual.emplace_back(BT * C);
    s.layers.resize(L);
    for (auto& a : s.layers) {
      a.ln1 = Buf<A>(BT * C);
      a.ln1_mean = Buf<float>(BT);
      a.ln1_rstd = Buf<float>(BT);
      a.qkv = Buf<A>(BT * 3 * C);
      a.atty = Buf<A>(BT * C);
      a.att = Buf<A>(B_ * NH * T_ * T_);
      a.res2 = Buf<A>(BT * C);
      a.ln2 = Buf<A>(BT * C);
      a.ln2_mean = Buf<float>(BT);
      a.ln2_rstd = Buf<float>(BT);
      a.fch = Buf<A>(BT * 4 * C);
      a.fch_gelu = Buf<A>(BT * 4 * C);
    }
    if (range_.has_embedding) {
      s.tokens = Buf<int32_t>(BT);
      s.group_tokens = Buf<int32_t>(BT);
      s.group_starts = Buf<int32_t>(BT + 1);
      s.group_positions = Buf<int32_t>(BT);
    }
    if (range_.has_head) {
      s.lnf = Buf<A>(BT * C);
      s.lnf_mean = Buf<float>(BT);
      s.lnf_rstd = Buf<float>(BT);
      s.logits = Buf<A>(BT * cfg_.padded_vocab());
      s.losses = Buf<float>(BT);
      s.targets = Buf<int32_t>(BT);
    }
  }
  dres_ = Buf<A>(BT * C);
  dln_ = Buf<A>(BT * C);
  datty_ = Buf<A>(BT * C);
  if (L > 0) {
    dqkv_ = Buf<A>(BT * 3 * C);
    d4_ = Buf<A>(BT * 4 * C);
    datt_ = Buf<A>(B_ * NH * T_ * T_);
    scratch_qkv_ = Buf<A>(BT * 3 * C);
    scratch_y_ = Buf<A>(BT * C);
    scratch_dqkv_ = Buf<A>(BT * 3 * C);
  }
  loss_sum_ = Buf<double>(1);
  reduce_scratch_ = Buf<double>(kReduceBlocks);
  CUDA_CHECK(cudaMemsetAsync(loss_sum_.get(), 0, sizeof(double), stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

template <class A>
CudaGptStage<A>::~CudaGptStage() {
  // Buffers are freed by their owners; the stream goes last, once idle.
  cudaStreamSynchronize(stream_);
  blas_.reset();
  cudaStreamDestroy(stream_);
}

template <class A>
void CudaGptStage<A>::refresh_weights() {
  if constexpr (!std::is_same_v<A, float>) convert(weights_, params_.get(), params_.size(), stream_);
}

template <class A>
void CudaGptStage<A>::init_parameters(uint64_t seed) {
  std::vector<float> host(table_.total_storage());
  fill_initial_parameters(table_, seed, host.data());
  upload(params_.get(), host.data(), sizeof(float) * host.size(), stream_);
  refresh_weights();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

template <class A>
void CudaGptStage<A>::zero_grads() {
  CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, sizeof(float) * grads_.size(), stream_));
}

template <class A>
void CudaGptStage<A>::forward(int slot, const int32_t* tokens, const int32_t* targets,
                              bool for_backward, float grad_scale) {
  const StageLayout& at = at_;
  Slot& s = slots_[slot];
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  const A* W = weights_;
  const AttentionScratch<A> scratch{scratch_qkv_.get(), scratch_y_.get(), scratch_dqkv_.get()};
  // Every host-to-device copy first, before any kernel of this micro-batch
  // is queued: a copy from pageable memory waits for the stream to drain,
  // so copies in the middle would stall the GPU while the host queues the
  // rest. The token grouping (a sort on the host) is made before the first
  // copy, while the GPU is still busy with earlier work.
  if (range_.has_embedding) {
    groups_host_.build(tokens, BT);
    s.groups = static_cast<int64_t>(groups_host_.tokens.size());
    upload(s.tokens.get(), tokens, sizeof(int32_t) * BT, stream_);
    upload(s.group_tokens.get(), groups_host_.tokens.data(), sizeof(int32_t) * s.groups, stream_);
    upload(s.group_starts.get(), groups_host_.starts.data(), sizeof(int32_t) * (s.groups + 1),
           stream_);
    upload(s.group_positions.get(), groups_host_.positions.data(), sizeof(int32_t) * BT, stream_);
  }
  if (range_.has_head) upload(s.targets.get(), targets, sizeof(int32_t) * BT, stream_);
  if (range_.has_embedding) {
    embedding_forward(s.residual[0].get(), s.tokens.get(), W + at.wte, W + at.wpe, B_, T_, C,
                      stream_);
  }
  for (int64_t i = 0; i < range_.num_layers(); ++i) {
    const auto w = at.layer<BlockTensors<const A>>(W, i);
    LayerActs& a = s.layers[i];
    const A* x = s.residual[i].get();
    layernorm_forward(a.ln1.get(), a.ln1_mean.get(), a.ln1_rstd.get(), x, w.ln1w, w.ln1b, BT, C,
                      stream_);
    matmul_forward(*blas_, a.qkv.get(), a.ln1.get(), w.qkvw, w.qkvb, BT, C, 3 * C);
    attention_forward(*blas_, a.atty.get(), a.att.get(), a.qkv.get(), scratch, B_, T_, C, NH);
    matmul_forward(*blas_, a.res2.get(), a.atty.get(), w.attprojw, w.attprojb, BT, C, C);
    residual_forward(a.res2.get(), x, a.res2.get(), BT * C, stream_);
    layernorm_forward(a.ln2.get(), a.ln2_mean.get(), a.ln2_rstd.get(), a.res2.get(), w.ln2w,
                      w.ln2b, BT, C, stream_);
    matmul_forward(*blas_, a.fch.get(), a.ln2.get(), w.fcw, w.fcb, BT, C, 4 * C);
    gelu_forward(a.fch_gelu.get(), a.fch.get(), BT * 4 * C, stream_);
    A* out = s.residual[i + 1].get();
    matmul_forward(*blas_, out, a.fch_gelu.get(), w.fcprojw, w.fcprojb, BT, 4 * C, C);
    residual_forward(out, a.res2.get(), out, BT * C, stream_);
  }
  if (!range_.has_head) return;
  const int64_t Vp = cfg_.padded_vocab();
  layernorm_forward(s.lnf.get(), s.lnf_mean.get(), s.lnf_rstd.get(), s.residual.back().get(),
                    W + at.lnf_w, W + at.lnf_b, BT, C, stream_);
  matmul_forward(*blas_, s.logits.get(), s.lnf.get(), W + at.wte, static_cast<const A*>(nullptr),
                 BT, C, Vp);
  if (for_backward) {
    crossentropy_forward_backward(s.losses.get(), s.logits.get(), s.targets.get(), BT,
                                  cfg_.vocab_size, Vp, grad_scale, stream_);
  } else {
    crossentropy_forward(s.losses.get(), s.logits.get(), s.targets.get(), BT, cfg_.vocab_size, Vp,
                         stream_);
  }
  reduce_sum(loss_sum_.get(), s.losses.get(), BT, false, true, reduce_scratch_.get(), stream_);
}

template <class A>
void CudaGptStage<A>::backward(int slot, const A* dout, const GradsFinal& grads_final) {
  const StageLayout& at = at_;
  auto final_from = [&](int64_t offset) {
    if (grads_final) grads_final(offset);
  };
  Slot& s = slots_[slot];
  const int64_t BT = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  const A* W = weights_;
  float* G = grads_.get();
  A* dres = dres_.get();
  const AttentionScratch<A> scratch{scratch_qkv_.get(), scratch_y_.get(), scratch_dqkv_.get()};
  if (range_.has_head) {
    const int64_t Vp = cfg_.padded_vocab();
    // The tied head's weight gradient lands in wte's, as on the host.
    matmul_backward(*blas_, dln_.get(), G + at.wte, static_cast<float*>(nullptr), s.logits.get(),
                    s.lnf.get(), W + at.wte, BT, C, Vp);
    CUDA_CHECK(cudaMemsetAsync(dres, 0, sizeof(A) * BT * C, stream_));
    layernorm_backward(dres, G + at.lnf_w, G + at.lnf_b, dln_.get(), s.residual.back().get(),
                       W + at.lnf_w, s.lnf_mean.get(), s.lnf_rstd.get(), BT, C, stream_);
    final_from(at.lnf_w);
  } else {
    CUDA_CHECK(
        cudaMemcpyAsync(dres, dout, sizeof(A) * BT * C, cudaMemcpyDeviceToDevice, stream_));
  }
  for (int64_t i = range_.num_layers() - 1; i >= 0; --i) {
    const auto w = at.layer<BlockTensors<const A>>(W, i);
    const auto g = at.layer<BlockTensors<float>>(G, i);
    LayerActs& a = s.layers[i];
    matmul_backward(*blas_, d4_.get(), g.fcprojw, g.fcprojb, dres, a.fch_gelu.get(), w.fcprojw,
                    BT, 4 * C, C);
    gelu_backward(d4_.get(), a.fch.get(), d4_.get(), BT * 4 * C, stream_);
    matmul_backward(*blas_, dln_.get(), g.fcw, g.fcb, d4_.get(), a.ln2.get(), w.fcw, BT, C, 4 * C);
    layernorm_backward(dres, g.ln2w, g.ln2b, dln_.get(), a.res2.get(), w.ln2w, a.ln2_mean.get(),
                       a.ln2_rstd.get(), BT, C, stream_);
    matmul_backward(*blas_, datty_.get(), g.attprojw, g.attprojb, dres, a.atty.get(), w.attprojw,
                    BT, C, C);
    attention_backward(*blas_, dqkv_.get(), datt_.get(), datty_.get(), a.qkv.get(), a.att.get(),
                       scratch, B_, T_, C, NH);
    matmul_backward(*blas_, dln_.get(), g.qkvw, g.qkvb, dqkv_.get(), a.ln1.get(), w.qkvw, BT, C,
                    3 * C);
    layernorm_backward(dres, g.ln1w, g.ln1b, dln_.get(), s.residual[i].get(), w.ln1w,
                       a.ln1_mean.get(), a.ln1_rstd.get(), BT, C, stream_);
    final_from(at.layers[i][0]);
  }
  if (range_.has_embedding) {
    const DeviceTokenGroups groups{s.group_tokens.get(), s.group_starts.get(),
                                   s.group_positions.get(), s.groups};
    embedding_backward(G + at.wte, G + at.wpe, dres, groups, B_, T_, C, stream_);
  }
  final_from(0);
}

template <class A>
double CudaGptStage<A>::take_loss_sum() {
  double sum = 0;
  CUDA_CHECK(cudaMemcpyAsync(&sum, loss_sum_.get(), sizeof sum, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaMemsetAsync(loss_sum_.get(), 0, sizeof(double), stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return sum;
}

template class CudaGptStage<float>;
template class CudaGptStage<cuda::bf16>;

}  // namespace mpiformer
