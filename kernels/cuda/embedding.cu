#include <algorithm>
#include <limits>
#include <numeric>

#include "core/cuda_check.hpp"
#include "cuda/device_math.cuh"
#include "cuda/embedding.hpp"

namespace mpiformer::cuda {

void TokenGroups::build(const int32_t* tok, int64_t n) {
  // Called once per micro-batch: the vectors keep their capacity, and
  // std::sort on (token, position) (a total order, so the result is fixed
  // and positions of one token stay increasing) needs no scratch memory,
  // unlike stable_sort.
  positions.resize(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), 0);
  std::sort(positions.begin(), positions.end(), [tok](int32_t a, int32_t b) {
    return tok[a] != tok[b] ? tok[a] < tok[b] : a < b;
  });
  tokens.clear();
  starts.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || tok[positions[i]] != tok[positions[i - 1]]) {
      tokens.push_back(tok[positions[i]]);
      starts.push_back(static_cast<int32_t>(i));
    }
  }
  starts.push_back(static_cast<int32_t>(n));
}

namespace {

template <class A>
__global__ void embedding_forward_kernel(A* out, const int32_t* tokens, const A* wte,
                                         const A* wpe, int64_t BT, int64_t T, int64_t C,
                                         int64_t vocab_begin, int64_t vocab_rows,
                                         const int32_t* positions, bool keep_outside) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= BT * C) return;
  const int64_t bt = i / C, c = i % C;
  const int64_t row = static_cast<int64_t>(tokens[bt]) - vocab_begin;
  if (row < 0 || row >= vocab_rows) {
    if (!keep_outside) out[i] = from_float<A>(0.f);
    return;
  }
  const float e = to_float(wte[row * C + c]);
  const int64_t t = positions != nullptr ? positions[bt] : bt % T;
  out[i] = wpe == nullptr ? wte[row * C + c] : from_float<A>(e + to_float(wpe[t * C + c]));
}

template <class A>
__global__ void embedding_forward_rows_kernel(A* rows, const int32_t* tokens, const int32_t* order,
                                              int64_t first, int64_t count, const A* wte,
                                              const A* wpe, int64_t T, int64_t C,
                                              int64_t vocab_begin, const int32_t* positions,
                                              int64_t vocab_rows) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count * C) return;
  const int64_t k = i / C, c = i % C;
  const int64_t p = order[first + k], t = positions != nullptr ? positions[p] : p % T;
  const int64_t row = static_cast<int64_t>(tokens[p]) - vocab_begin;
  if (row < 0 || row >= vocab_rows) return;  // another piece's (host/embedding.hpp)
  const float e = to_float(wte[row * C + c]);
  rows[i] = wpe == nullptr ? wte[row * C + c] : from_float<A>(e + to_float(wpe[t * C + c]));
}

template <class A>
__global__ void scatter_rows_kernel(A* out, const A* gathered, const int32_t* order, int64_t n,
                                    int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * C) return;
  const int64_t k = i / C, c = i % C;
  out[static_cast<int64_t>(order[k]) * C + c] = gathered[i];
}

// Grid (distinct tokens, channel blocks): one thread per (token, channel)
// sums that token's positions in order.
template <class A>
__global__ void embedding_backward_wte_kernel(float* dwte, const A* dout,
                                              DeviceTokenGroups groups, int64_t C,
                                              int64_t vocab_begin, int64_t vocab_rows) {
  const int64_t c = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t u = blockIdx.x;
  const int64_t row = static_cast<int64_t>(groups.tokens[u]) - vocab_begin;
  if (c >= C || row < 0 || row >= vocab_rows) return;
  float sum = 0.f;
  for (int32_t k = groups.starts[u]; k < groups.starts[u + 1]; ++k)
    sum += to_float(dout[static_cast<int64_t>(groups.positions[k]) * C + c]);
  dwte[row * C + c] += sum;
}

// One thread per (t, c): the sum over the batch, in batch order.
template <class A>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const A* dout, int64_t B, int64_t T,
                                              int64_t C) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * C) return;
  float sum = 0.f;
  for (int64_t b = 0; b < B; ++b) sum += to_float(dout[b * T * C + i]);
  dwpe[i] += sum;
}

}  // namespace

template <class A>
void embedding_forward(A* out, const int32_t* tokens, const A* wte, const A* wpe, int64_t B,
                       int64_t T, int64_t C, int64_t vocab_begin, int64_t vocab_rows,
                       cudaStream_t stream, const int32_t* positions, bool keep_outside) {
  const int threads = 256;
  embedding_forward_kernel<<<blocks_for(B * T * C, threads), threads, 0, stream>>>(
      out, tokens, wte, wpe, B * T, T, C, vocab_begin, vocab_rows, positions, keep_outside);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void embedding_forward_rows(A* rows, const int32_t* tokens, const int32_t* order, int64_t first,
                            int64_t count, const A* wte, const A* wpe, int64_t T, int64_t C,
                            int64_t vocab_begin, cudaStream_t stream,
                            const int32_t* positions, int64_t vocab_rows) {
  if (count == 0) return;
  const int threads = 256;
  embedding_forward_rows_kernel<<<blocks_for(count * C, threads), threads, 0, stream>>>(
      rows, tokens, order, first, count, wte, wpe, T, C, vocab_begin, positions, vocab_rows);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void scatter_rows(A* out, const A* gathered, const int32_t* order, int64_t n, int64_t C,
                  cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  scatter_rows_kernel<<<blocks_for(n * C, threads), threads, 0, stream>>>(out, gathered, order, n,
                                                                         C);
  CUDA_CHECK_LAUNCH();
}

template <class A>
void embedding_backward(float* dwte, float* dwpe, const A* dout, const DeviceTokenGroups& groups,
                        int64_t B, int64_t T, int64_t C, int64_t vocab_begin, int64_t vocab_rows,
                        cudaStream_t stream, const DeviceTokenGroups* position_groups) {
  const int threads = 256;
  MPIFORMER_CHECK(groups.count > 0 && groups.count <= B * T,
                  "embedding_backward: token groups do not match the batch");
  const dim3 grid(static_cast<unsigned>(groups.count), blocks_for(C, threads));
  embedding_backward_wte_kernel<<<grid, threads, 0, stream>>>(dwte, dout, groups, C, vocab_begin,
                                                              vocab_rows);
  CUDA_CHECK_LAUNCH();
  if (dwpe == nullptr) return;  // no position table (Llama)
  if (position_groups != nullptr) {
    // Positions restart at each document, or run over the whole sequence
    // under context parallelism (past this rank's T rows): rows grouped by
    // position, as tokens are for dwte. A position's "vocabulary" is wpe's
    // rows, which the positions stay below (as the forward's reads, and the
    // host's twin, take them).
    const dim3 pgrid(static_cast<unsigned>(position_groups->count), blocks_for(C, threads));
    embedding_backward_wte_kernel<<<pgrid, threads, 0, stream>>>(
        dwpe, dout, *position_groups, C, 0, std::numeric_limits<int32_t>::max());
    CUDA_CHECK_LAUNCH();
    return;
  }
  embedding_backward_wpe_kernel<<<blocks_for(T * C, threads), threads, 0, stream>>>(dwpe, dout, B,
                                                                                    T, C);
  CUDA_CHECK_LAUNCH();
}

#define MPIFORMER_INSTANTIATE(A)                                                              \
  template void embedding_forward<A>(A*, const int32_t*, const A*, const A*, int64_t, int64_t, \
                                     int64_t, int64_t, int64_t, cudaStream_t, const int32_t*,  \
                                     bool);                                                    \
  template void embedding_backward<A>(float*, float*, const A*, const DeviceTokenGroups&,      \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t, \
                                      const DeviceTokenGroups*);                               \
  template void embedding_forward_rows<A>(A*, const int32_t*, const int32_t*, int64_t, int64_t, \
                                          const A*, const A*, int64_t, int64_t, int64_t,       \
                                          cudaStream_t, const int32_t*, int64_t);              \
  template void scatter_rows<A>(A*, const A*, const int32_t*, int64_t, int64_t, cudaStream_t);
MPIFORMER_INSTANTIATE(float)
MPIFORMER_INSTANTIATE(bf16)
MPIFORMER_INSTANTIATE(fp16)

}  // namespace mpiformer::cuda
