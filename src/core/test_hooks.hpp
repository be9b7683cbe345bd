// Every switch mpiformer reads from the environment for its tests, in one
// place (the deck is the user's interface; these are the test suite's).
// Each is read where it applies; none changes a number a run computes.
//
//   MPIFORMER_FAULT_NONFINITE_STEP=N   world rank 0's gradients become NaN at
//       step N (host back end), as a numerical or hardware fault would.
//   MPIFORMER_FAULT_NONFINITE_WEIGHTS_SAVE=N  world rank 0's first weight
//       becomes NaN just before the save of step N (host back end), as a
//       memory fault would make it.
//   MPIFORMER_CHECKPOINT_FAULT_AFTER=N the job dies after N datasets of a
//       checkpoint are written, as a node failure would.
//   MPIFORMER_FAULT_OFFLOAD_WRITE=N    world rank 0's N-th write of offloaded
//       optimizer state (io/offload_files.hpp) fails with EIO, as a failing
//       disk's would.
//   MPIFORMER_FAULT_OFFLOAD_TAMPER=N:ACTION  at the save of step N, world
//       rank 0's first offloaded optimizer file is done to through its
//       name as an outside process would: "replace" (another file moved
//       over it), "remove", "cut" (truncated), or "cut-in-save" (truncated
//       once the save has mapped it).
//   MPIFORMER_FAULT_CORRUPT_CHECKPOINT=N  world rank 0 changes one value of
//       the checkpoint of step N once it is written and before it is read
//       back, as a failing disk or a stray writer would.
//   MPIFORMER_SLOW_BACKGROUND_WRITE_MS=N  a background checkpoint write
//       ([checkpoint] async) waits N ms before its first byte, as a slow
//       or busy file system would make it last: the next save, and a stop,
//       then find it still in flight.
//   MPIFORMER_OFFLOAD_BUFFERED=1       offloaded optimizer state is written
//       and read as on a file system without direct I/O (buffered, each
//       block dropped from the page cache), whatever the file system.
//   MPIFORMER_REHEARSE_GPU=1           the host back end reports as a GPU run
//       does where scripts read it: no host-side timings in the log or in
//       metrics.jsonl (matmul_fraction, optimizer_ms, bubble, reduce_exposed_ms,
//       tp_reduce_fraction), so the GPU suite's scripts run here exactly as
//       they will on a device, and a script that needs a host-only key
//       fails here, not in the one GPU window.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mpiformer::test_hooks {

// The integer value of `name`, or -1 when unset.
inline int64_t env_step(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : -1;
}

inline int64_t fault_nonfinite_step() { return env_step("MPIFORMER_FAULT_NONFINITE_STEP"); }
inline int64_t fault_nonfinite_weights_save() {
  return env_step("MPIFORMER_FAULT_NONFINITE_WEIGHTS_SAVE");
}
inline int64_t checkpoint_fault_after() { return env_step("MPIFORMER_CHECKPOINT_FAULT_AFTER"); }

inline int64_t fault_offload_write() { return env_step("MPIFORMER_FAULT_OFFLOAD_WRITE"); }

// MPIFORMER_FAULT_OFFLOAD_TAMPER's step and action (-1 and "" when unset).
struct OffloadTamper {
  int64_t step = -1;
  std::string action;
};
inline OffloadTamper fault_offload_tamper() {
  const char* v = std::getenv("MPIFORMER_FAULT_OFFLOAD_TAMPER");
  if (v == nullptr) return {};
  const char* colon = std::strchr(v, ':');
  if (colon == nullptr) return {};
  return {std::atoll(v), std::string(colon + 1)};
}
inline int64_t fault_corrupt_checkpoint() { return env_step("MPIFORMER_FAULT_CORRUPT_CHECKPOINT"); }

inline int64_t slow_background_write_ms() { return env_step("MPIFORMER_SLOW_BACKGROUND_WRITE_MS"); }

inline bool offload_buffered() {
  const char* v = std::getenv("MPIFORMER_OFFLOAD_BUFFERED");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

inline bool rehearse_gpu() {
  const char* v = std::getenv("MPIFORMER_REHEARSE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace mpiformer::test_hooks
