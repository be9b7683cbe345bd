// CPU emulation of the CUDA programming model, for testing the CUDA back end
// where there is no GPU. Force-included (-include) before every source of
// the emulated build; the kernels' `<<<...>>>` launches are first rewritten
// into emu::launch calls by unchevron.py.
//
// Every CUDA thread of a block runs as a fiber (ucontext) on one OS thread;
// __syncthreads and warp shuffles switch fibers, so block- and warp-level
// cooperation behaves as on a GPU, and a barrier some threads never reach is
// reported as a deadlock instead of hanging. Blocks run one after another.
// __shared__ variables become function statics: shared by the block's
// threads, reused by the next block. Device memory is host memory.
//
// This checks the kernels' logic (indexing, synchronisation, reductions,
// precision handling); it says nothing about speed, and cuBLASLt is
// replaced by the host BLAS (gemm_emulated.cpp).
#pragma once
#define MPIFORMER_CUDA_EMULATION 1
#define __shared__ static
#define __launch_bounds__(...)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>

namespace emu {

struct Config {
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  Config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr)
      : grid(g), block(b), shared_bytes(s), stream(st) {}
};

// Runs `kernel` once per thread of every block of the launch.
void run(const Config& config, const std::function<void()>& kernel);
template <class F>
void launch(const Config& config, F&& kernel) {
  run(config, std::function<void()>(std::forward<F>(kernel)));
}

const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void syncthreads();
// Lane exchange within the current warp: every live lane deposits `bytes`
// (at most 8), then reads lane `src`'s.
void warp_exchange(const void* mine, void* theirs, unsigned src, size_t bytes);

// The launch's dynamic shared memory, filled with 0xff bytes (NaN in every
// float type) before each block, so a read of what no thread wrote shows.
unsigned char* dynamic_shared();
void syncwarp();
[[noreturn]] void trap();

template <class T>
T shfl(unsigned /*mask*/, T v, int src) {
  static_assert(sizeof(T) <= 8, "emulated shuffles move at most 8 bytes");
  T out{};
  warp_exchange(&v, &out, static_cast<unsigned>(src) % 32, sizeof(T));
  return out;
}

template <class T>
T shfl_xor(unsigned /*mask*/, T v, int offset) {
  static_assert(sizeof(T) <= 8, "emulated shuffles move at most 8 bytes");
  const unsigned lane = (thread_idx().x + thread_idx().y * block_dim().x) % 32;
  T out{};
  warp_exchange(&v, &out, lane ^ static_cast<unsigned>(offset), sizeof(T));
  return out;
}

inline float fast_exp(float x) { return std::exp(x); }
inline float rsqrt(float x) { return 1.f / std::sqrt(x); }

}  // namespace emu

#define threadIdx (::emu::thread_idx())
#define blockIdx (::emu::block_idx())
#define blockDim (::emu::block_dim())
#define gridDim (::emu::grid_dim())
#define __syncthreads() ::emu::syncthreads()
#define __shfl_xor_sync(mask, v, offset) ::emu::shfl_xor(mask, v, offset)
#define __shfl_sync(mask, v, src) ::emu::shfl(mask, v, src)
#define __syncwarp(...) ::emu::syncwarp()
#define __trap() ::emu::trap()
// Blocks run one at a time: every write is visible to the next.
#define __threadfence() ((void)0)
#define __expf(x) ::emu::fast_exp(x)
#define rsqrtf(x) ::emu::rsqrt(x)
