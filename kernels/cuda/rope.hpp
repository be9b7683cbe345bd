// Rotary position embeddings on the GPU (host twin: host/rope.hpp, whose
// layout, pairing and table these follow): in place on the q and k heads
// of qkv [N, C + 2K]; `table` [T, hs/2, 2] (cos, sin) in device memory,
// the host's rope_table uploaded, so both back ends rotate by the same
// values. sign +1 forward, -1 backward.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mpiformer::cuda {

// `positions` [N] (device; nullptr: row n is position n % T): each row's
// position in its document ([data] document_mask).
template <class A>
void rope_rotate(A* qkv, const float* table, int64_t N, int64_t T, int64_t C, int64_t K,
                 int64_t hs, float sign, cudaStream_t stream, const int32_t* positions = nullptr);

}  // namespace mpiformer::cuda
