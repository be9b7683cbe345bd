// Softmax cross-entropy over a padded vocabulary on the GPU (host twin:
// host/crossentropy.hpp). logits [N,Vp] of the activation type, only the
// first V columns real; losses [N] in float. One block per row; the
// softmax is computed in float.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

template <class A>
void crossentropy_forward(float* losses, const A* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp, cudaStream_t stream);

// Fused forward and backward in place: logits becomes
// grad_scale * (softmax - onehot(target)), padded columns zero.
template <class A>
void crossentropy_forward_backward(float* losses, A* logits, const int32_t* targets, int64_t N,
                                   int64_t V, int64_t Vp, float grad_scale, cudaStream_t stream);

// The vocabulary-parallel cross-entropy's three passes (host twin and
// semantics: host/crossentropy.hpp): logits [N, Vl] of columns [v0, v0 +
// Vl), the first V real; rowmax [N] and stats [2N] float.
template <class A>
void crossentropy_vp_max(float* rowmax, const A* logits, int64_t N, int64_t V, int64_t Vl,
                         cudaStream_t stream);
template <class A>
void crossentropy_vp_sums(float* stats, const A* logits, const int32_t* targets,
                          const float* rowmax, int64_t N, int64_t V, int64_t Vl, int64_t v0,
                          cudaStream_t stream);
template <class A>
void crossentropy_vp_finish(float* losses, A* logits, const int32_t* targets, const float* rowmax,
                            const float* stats, int64_t N, int64_t V, int64_t Vl, int64_t v0,
                            float grad_scale, bool backward, cudaStream_t stream);

}  // namespace mpiformer::cuda
