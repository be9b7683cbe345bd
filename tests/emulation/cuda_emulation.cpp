// The fiber scheduler behind cuda_emulation.hpp, and the part of the CUDA
// runtime API the back end calls, on host memory.
#include "cuda_emulation.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// Switching fibers is most of the emulation's time. glibc's swapcontext
// makes two system calls per switch (the signal mask); fibers here never
// touch signals, so on x86-64 a switch saves only the callee-saved
// registers (System V ABI) and swaps stacks.
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
.section .note.GNU-stack,"",@progbits
.text
)");

namespace emu {
namespace {

enum class State { NotStarted, Ready, AtBlockBarrier, AtWarpBarrier, Done };

constexpr size_t kStackBytes = 128 * 1024;
constexpr int kMaxThreads = 1024;

struct Fiber {
  void* sp = nullptr;     // saved stack pointer while switched out
  char* stack = nullptr;  // from the pool while started and not done
  State state = State::Done;
  uint3 index;
};

struct Scheduler {
  void* main_sp = nullptr;
  std::vector<Fiber> fibers;
  int current = -1;
  int count = 0;
  dim3 grid, block;
  uint3 block_index;
  const std::function<void()>* kernel = nullptr;
  bool direct = false;  // threads run as plain calls on the scheduler's stack
  std::exception_ptr error;
  // Two sets of shuffle slots, used alternately by successive shuffles: no
  // lane can get two shuffles ahead of another (each waits for the whole
  // warp), so one wait per shuffle suffices.
  unsigned char slots[2][kMaxThreads][8];
  unsigned char parity[kMaxThreads];
  // Stacks are taken when a fiber starts and returned when it ends, so a
  // kernel without barriers runs every thread on the same (cache-hot) stack.
  std::vector<std::unique_ptr<char[]>> stacks;
  unsigned char* dynamic = nullptr;  // the launch's dynamic shared memory
  size_t dynamic_bytes = 0, dynamic_capacity = 0;
  std::vector<char*> free_stacks;
  Scheduler() : fibers(kMaxThreads) {}
  char* take_stack() {
    if (free_stacks.empty()) {
      stacks.emplace_back(new char[kStackBytes]);
      return stacks.back().get();
    }
    char* s = free_stacks.back();
    free_stacks.pop_back();
    return s;
  }
};

Scheduler& sched() {
  static Scheduler s;
  return s;
}

[[noreturn]] void fiber_entry() {
  Scheduler& s = sched();
  try {
    (*s.kernel)();
  } catch (...) {
    if (!s.error) s.error = std::current_exception();
  }
  Fiber& f = s.fibers[s.current];
  f.state = State::Done;
  // The stack goes back to the pool while still in use by this very call:
  // nothing runs on it again until the scheduler, on its own stack, hands it
  // to the next fiber.
  s.free_stacks.push_back(f.stack);
  f.stack = nullptr;
  emu_switch(&f.sp, s.main_sp);
  std::abort();  // a finished fiber is never resumed
}

// A fresh fiber's stack, as emu_switch leaves one: six callee-saved
// registers, then the address `ret` jumps to (fiber_entry), with the stack
// 16-byte aligned at that function's entry as the ABI requires.
void* initial_stack(char* base) {
  auto top = reinterpret_cast<uintptr_t>(base + kStackBytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;  // fiber_entry's own return address: never used
  *--sp = reinterpret_cast<void*>(&fiber_entry);
  for (int r = 0; r < 6; ++r) *--sp = nullptr;
  return sp;
}

void wait_at(State barrier) {
  Scheduler& s = sched();
  if (s.direct) {
    throw std::logic_error(
        "emulated kernel: thread " + std::to_string(s.current) +
        " reached a barrier or shuffle that thread 0 of its block never reached (divergent "
        "synchronisation, undefined on a GPU)");
  }
  Fiber& f = s.fibers[s.current];
  f.state = barrier;
  emu_switch(&f.sp, s.main_sp);
}

// Releases the threads waiting at a barrier that every live thread of its
// scope (block, or warp) has reached; false when none could be released.
bool release(Scheduler& s) {
  int live = 0, at_block = 0;
  for (int t = 0; t < s.count; ++t) {
    if (s.fibers[t].state != State::Done) ++live;
    if (s.fibers[t].state == State::AtBlockBarrier) ++at_block;
  }
  bool released = false;
  if (live > 0 && at_block == live) {
    for (int t = 0; t < s.count; ++t)
      if (s.fibers[t].state == State::AtBlockBarrier) s.fibers[t].state = State::Ready;
    return true;
  }
  for (int w = 0; w * 32 < s.count; ++w) {
    int lanes = 0, waiting = 0;
    for (int t = w * 32; t < std::min(s.count, w * 32 + 32); ++t) {
      if (s.fibers[t].state != State::Done) ++lanes;
      if (s.fibers[t].state == State::AtWarpBarrier) ++waiting;
    }
    if (lanes > 0 && waiting == lanes) {
      for (int t = w * 32; t < std::min(s.count, w * 32 + 32); ++t)
        if (s.fibers[t].state == State::AtWarpBarrier) s.fibers[t].state = State::Ready;
      released = true;
    }
  }
  return released;
}

// Thread 0 runs first, as a fiber. If it ends without ever waiting, the
// kernel has no barrier its block's threads must all reach (CUDA requires
// __syncthreads and full-warp shuffles to be reached by all or none), so the
// other threads run as plain calls: no stacks, no switches. A thread that
// waits anyway is reported, never silently mis-run.
bool run_thread0_alone(Scheduler& s) {
  Fiber& f = s.fibers[0];
  f.stack = s.take_stack();
  f.sp = initial_stack(f.stack);
  f.state = State::Ready;
  s.current = 0;
  emu_switch(&s.main_sp, f.sp);
  if (f.state != State::Done) return false;
  if (s.error) return true;
  s.direct = true;
  for (int t = 1; t < s.count; ++t) {
    s.current = t;
    (*s.kernel)();
  }
  s.direct = false;
  return true;
}

void run_block(Scheduler& s) {
  for (int t = 0; t < s.count; ++t) {
    Fiber& f = s.fibers[t];
    f.index = make_uint3(t % s.block.x, (t / s.block.x) % s.block.y, t / (s.block.x * s.block.y));
    f.state = State::NotStarted;
    s.parity[t] = 0;
  }
  if (run_thread0_alone(s)) {
    s.current = -1;
    return;
  }
  for (;;) {
    bool any_live = false;
    for (int t = 0; t < s.count; ++t) {
      Fiber& f = s.fibers[t];
      if (f.state == State::NotStarted) {
        f.stack = s.take_stack();
        f.sp = initial_stack(f.stack);
        f.state = State::Ready;
      }
      if (f.state != State::Ready) continue;
      s.current = t;
      emu_switch(&s.main_sp, f.sp);
    }
    for (int t = 0; t < s.count; ++t) any_live |= s.fibers[t].state != State::Done;
    if (!any_live) break;
    if (!release(s)) {
      throw std::logic_error(
          "emulated kernel deadlock: a __syncthreads or warp shuffle not reached by every "
          "live thread of its block or warp");
    }
  }
  s.current = -1;
}

}  // namespace

void run(const Config& config, const std::function<void()>& kernel) {
  Scheduler& s = sched();
  s.grid = config.grid;
  s.block = config.block;
  s.count = static_cast<int>(config.block.x * config.block.y * config.block.z);
  if (s.count < 1 || s.count > kMaxThreads)
    throw std::invalid_argument("emulated launch: block of " + std::to_string(s.count) + " threads");
  s.kernel = &kernel;
  s.error = nullptr;
  if (config.shared_bytes > s.dynamic_capacity) {
    std::free(s.dynamic);
    s.dynamic_capacity = (config.shared_bytes + 127) / 128 * 128;
    s.dynamic = static_cast<unsigned char*>(std::aligned_alloc(128, s.dynamic_capacity));
  }
  s.dynamic_bytes = config.shared_bytes;
  for (unsigned z = 0; z < config.grid.z; ++z)
    for (unsigned y = 0; y < config.grid.y; ++y)
      for (unsigned x = 0; x < config.grid.x; ++x) {
        s.block_index = make_uint3(x, y, z);
        if (s.dynamic_bytes > 0) std::memset(s.dynamic, 0xff, s.dynamic_bytes);
        try {
          run_block(s);
        } catch (...) {
          s.direct = false;
          throw;
        }
        if (s.error) std::rethrow_exception(s.error);
      }
}

const uint3& thread_idx() { return sched().fibers[sched().current].index; }
const uint3& block_idx() { return sched().block_index; }
const dim3& block_dim() { return sched().block; }
const dim3& grid_dim() { return sched().grid; }
void syncthreads() { wait_at(State::AtBlockBarrier); }
void syncwarp() { wait_at(State::AtWarpBarrier); }
unsigned char* dynamic_shared() { return sched().dynamic_bytes > 0 ? sched().dynamic : nullptr; }
void trap() {
  throw std::logic_error("emulated kernel: __trap() (a device-side check failed; on a GPU the "
                         "launch fails with an unspecified launch failure)");
}

// Exactly `bytes` each way: a 4-byte value's neighbour on the caller's
// stack is not the exchange's to write (8 bytes there overwrote a saved
// register under -O3 -march=native).
void warp_exchange(const void* mine, void* theirs, unsigned src, size_t bytes) {
  Scheduler& s = sched();
  const int t = s.current, warp_base = t - t % 32;
  const int p = s.parity[t];
  s.parity[t] ^= 1;
  std::memcpy(s.slots[p][t], mine, bytes);
  wait_at(State::AtWarpBarrier);  // every lane has deposited
  std::memcpy(theirs, s.slots[p][warp_base + static_cast<int>(src)], bytes);
}

}  // namespace emu

// ---- the CUDA runtime API subset, on host memory --------------------------
extern "C" {

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int) {
  std::snprintf(id, static_cast<size_t>(len), "emulated");
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "CPU emulation");
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "emulated CUDA error"; }
cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
// "Device" memory is the host's.
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  const auto pages = static_cast<size_t>(sysconf(_SC_PHYS_PAGES));
  const auto avail = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES));
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  *free = avail * page;
  *total = pages * page;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  std::memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* d, int v, size_t n) {
  std::memset(d, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) {
  std::memset(d, v, n);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  static int streams;
  *s = reinterpret_cast<cudaStream_t>(&streams);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  static int events;
  *e = reinterpret_cast<cudaEvent_t>(&events);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 1.f;
  return cudaSuccess;
}

}  // extern "C"
