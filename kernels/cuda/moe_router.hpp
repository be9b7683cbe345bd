// The Mixture-of-Experts router on the GPU (host twin, with the
// definitions of everything it computes: host/moe_router.hpp), in float.
// Its outputs stay on the device: `kept` [E] and `totals`
// [kRouterTotals] (+=) included, for the caller to read once it must (the
// expert GEMMs' sizes). Under context parallelism (r.context > 1) the
// context group's `exchange`, on device memory, is required.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/moe_routing.hpp"

namespace mpiformer::cuda {

// Device scratch a call needs.
size_t router_scratch_bytes(const RouterShape& r);

void router_forward(const RouterShape& r, const float* logits, float* probs, float* lse,
                    int32_t* expert, float* gate, int32_t* dest, int32_t* chose, int64_t* kept,
                    double* totals, void* scratch, cudaStream_t stream,
                    const RouterExchange* exchange = nullptr);

void router_backward(const RouterShape& r, float* dlogits, const float* dgate, const float* probs,
                     const float* lse, const int32_t* expert, const float* gate,
                     const int32_t* chose, float aux_scale, float z_scale, cudaStream_t stream);

}  // namespace mpiformer::cuda
