// The router: a thread per token for the softmax, top-k and dispatch rows;
// a thread per sequence for its capacity pass (sequential by definition:
// assignments are taken in order) and its aux loss; one thread for the
// rows' prefix over (expert, sequence) and the totals, each summed in the
// host's order.
#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/moe_router.hpp"

namespace mpiformer::cuda {

namespace {

// The arithmetic is common/moe_routing.hpp's, shared with the host.
__global__ void softmax_topk_kernel(RouterShape r, const float* logits, float* probs, float* lse,
                                    int32_t* expert, float* gate) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= r.tokens) return;
  const int64_t E = r.experts, K = r.top_k;
  router_token(logits + n * E, probs + n * E, lse[n], expert + n * K, gate + n * K, E, K);
}

__global__ void capacity_kernel(RouterShape r, const float* probs, const int32_t* expert,
                                int32_t* dest, int32_t* chose, double* seq_aux,
                                int64_t* seq_dropped) {
  const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (s >= r.tokens / r.seq_len) return;
  seq_aux[s] = static_cast<double>(
      router_sequence(r, s, probs, expert, dest, chose + s * r.experts, seq_dropped[s]));
}

__global__ void rows_kernel(RouterShape r, const int32_t* chose, const float* lse,
                            const double* seq_aux, const int64_t* seq_dropped, int64_t* start,
                            int64_t* kept, double* totals) {
  router_rows(r, chose, start, kept);
  for (int64_t s = 0; s < r.tokens / r.seq_len; ++s) {
    totals[kAuxSum] += seq_aux[s];
    totals[kDropped] += static_cast<double>(seq_dropped[s]);
  }
  for (int64_t n = 0; n < r.tokens; ++n)
    totals[kZSum] += static_cast<double>(lse[n]) * static_cast<double>(lse[n]);
}

__global__ void dest_kernel(RouterShape r, const int32_t* expert, const int64_t* start,
                            int32_t* dest) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= r.tokens) return;
  const int64_t s = n / r.seq_len, E = r.experts, K = r.top_k;
  for (int64_t j = 0; j < K; ++j) {
    int32_t& d = dest[n * K + j];
    if (d >= 0) d = static_cast<int32_t>(start[s * E + expert[n * K + j]] + d);
  }
}

__global__ void router_backward_kernel(RouterShape r, float* dlogits, const float* dgate,
                                       const float* probs, const float* lse,
                                       const int32_t* expert, const float* gate,
                                       const int32_t* chose, float aux_scale, float z_scale) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (n >= r.tokens) return;
  const int64_t E = r.experts, K = r.top_k;
  router_token_backward(r, dlogits + n * E, dgate + n * K, probs + n * E, lse[n], expert + n * K,
                        gate + n * K, chose + (n / r.seq_len) * E, aux_scale, z_scale);
}

// The scratch: start [S E] and seq_dropped [S] (int64), seq_aux [S].
struct Scratch {
  int64_t* start;
  int64_t* seq_dropped;
  double* seq_aux;
};
Scratch carve(const RouterShape& r, void* scratch) {
  const int64_t S = r.tokens / r.seq_len;
  auto* base = static_cast<int64_t*>(scratch);
  return {base, base + S * r.experts, reinterpret_cast<double*>(base + S * r.experts + S)};
}

}  // namespace

size_t router_scratch_bytes(const RouterShape& r) {
  const int64_t S = r.tokens / r.seq_len;
  return static_cast<size_t>(S * r.experts + S) * sizeof(int64_t) + static_cast<size_t>(S) * sizeof(double);
}

void router_forward(const RouterShape& r, const float* logits, float* probs, float* lse,
                    int32_t* expert, float* gate, int32_t* dest, int32_t* chose, int64_t* kept,
                    double* totals, void* scratch, cudaStream_t stream) {
  if (r.tokens == 0) return;
  const Scratch w = carve(r, scratch);
  const int64_t S = r.tokens / r.seq_len;
  softmax_topk_kernel<<<blocks_for(r.tokens, 128), 128, 0, stream>>>(r, logits, probs, lse, expert,
                                                                     gate);
  CUDA_CHECK_LAUNCH();
  capacity_kernel<<<blocks_for(S, 64), 64, 0, stream>>>(r, probs, expert, dest, chose, w.seq_aux,
                                                         w.seq_dropped);
  CUDA_CHECK_LAUNCH();
  rows_kernel<<<1, 1, 0, stream>>>(r, chose, lse, w.seq_aux, w.seq_dropped, w.start, kept, totals);
  CUDA_CHECK_LAUNCH();
  dest_kernel<<<blocks_for(r.tokens, 128), 128, 0, stream>>>(r, expert, w.start, dest);
  CUDA_CHECK_LAUNCH();
}

void router_backward(const RouterShape& r, float* dlogits, const float* dgate, const float* probs,
                     const float* lse, const int32_t* expert, const float* gate,
                     const int32_t* chose, float aux_scale, float z_scale, cudaStream_t stream) {
  if (r.tokens == 0) return;
  router_backward_kernel<<<blocks_for(r.tokens, 128), 128, 0, stream>>>(
      r, dlogits, dgate, probs, lse, expert, gate, chose, aux_scale, z_scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mpiformer::cuda
