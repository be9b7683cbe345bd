// Token + position embedding on the GPU (host twin: host/embedding.hpp).
// out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]; wte [Vp,C], wpe [Tmax,C].
// Vocabulary-parallel as on the host: wte holds rows [vocab_begin,
// vocab_begin + vocab_rows); other tokens give zeros and no gradient.
//
// The backward must add the gradients of repeated tokens into one row of
// dwte. Atomics would make the sum order (and so the bits) change from run to
// run; instead the positions are grouped by token once per micro-batch on
// the host, where the tokens already are (TokenGroups), and one block sums
// each token's positions in order.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace mpiformer::cuda {

// Positions [0, B*T) grouped by token: group u is token `tokens[u]` at
// positions `positions[starts[u] .. starts[u+1])`, in increasing order.
struct TokenGroups {
  std::vector<int32_t> tokens, starts, positions;
  void build(const int32_t* tok, int64_t n);  // host side, O(n log n)
};

// The device copy of TokenGroups (buffers of n, n + 1 and n elements).
struct DeviceTokenGroups {
  int32_t* tokens;
  int32_t* starts;
  int32_t* positions;
  int64_t count;  // number of distinct tokens
};

// `positions` [B*T] (device; nullptr: t): each token's position in its
// document, which wpe's row is ([data] document_mask).
template <class A>
void embedding_forward(A* out, const int32_t* tokens, const A* wte, const A* wpe, int64_t B,
                       int64_t T, int64_t C, int64_t vocab_begin, int64_t vocab_rows,
                       cudaStream_t stream, const int32_t* positions = nullptr,
                       bool keep_outside = false);

// The vocabulary-parallel embedding as rows to gather (host twin and
// semantics: host/embedding.hpp's embedding_forward_rows, scatter_rows).
template <class A>
void embedding_forward_rows(A* rows, const int32_t* tokens, const int32_t* order, int64_t first,
                            int64_t count, const A* wte, const A* wpe, int64_t T, int64_t C,
                            int64_t vocab_begin, cudaStream_t stream,
                            const int32_t* positions = nullptr,
                            int64_t vocab_rows = std::numeric_limits<int64_t>::max());
template <class A>
void scatter_rows(A* out, const A* gathered, const int32_t* order, int64_t n, int64_t C,
                  cudaStream_t stream);

// Parameter gradients accumulate (+=) in float.
// `position_groups`: the rows grouped by their position (the positions'
// Tokens loaded grouped), so dwpe sums each position's rows in order as
// dwte sums each token's; nullptr: position t of every sequence.
template <class A>
void embedding_backward(float* dwte, float* dwpe, const A* dout, const DeviceTokenGroups& groups,
                        int64_t B, int64_t T, int64_t C, int64_t vocab_begin, int64_t vocab_rows,
                        cudaStream_t stream, const DeviceTokenGroups* position_groups = nullptr);

}  // namespace mpiformer::cuda
