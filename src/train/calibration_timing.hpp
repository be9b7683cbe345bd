// How `mpiformer calibrate` times a call, on every rank at once (as a step's
// ranks compute), on the host or a GPU: the shared part of its measurements
// (calibrate_kernels.hpp, calibrate_links.cpp, calibrate_memory.cpp).
#pragma once
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "core/mpi_check.hpp"

namespace mpiformer::calibration {

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call of `f`: every rank of `comm` starts together, warms up
// once, times one call, then (unless that call alone filled `budget`) all
// make the same number of calls (a collective's ranks must) filling about
// `budget`; the ranks' mean (they run at once, as a step's ranks do). `fence` waits until what the calls
// queued has run (a GPU's stream; nothing on the host).
template <class F, class Fence>
double seconds_per_call(MPI_Comm comm, double budget, F&& f, Fence&& fence) {
  MPI_CHECK(MPI_Barrier(comm));
  f();
  fence();
  double t0 = now();
  f();
  fence();
  const double mine = now() - t0;
  double once = mine;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, comm));
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  if (once >= budget) {
    // One warm call already fills the budget (a whole stage of a large
    // model): it is the measurement; another would only double the wait.
    double t = mine;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_SUM, comm));
    return t / size;
  }
  const int reps = static_cast<int>(std::clamp(budget / std::max(once, 1e-9), 1.0, 2000.0));
  MPI_CHECK(MPI_Barrier(comm));
  t0 = now();
  for (int i = 0; i < reps; ++i) f();
  fence();
  double t = (now() - t0) / reps;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_SUM, comm));
  return t / size;
}
template <class F>
double seconds_per_call(MPI_Comm comm, double budget, F&& f) {
  return seconds_per_call(comm, budget, std::forward<F>(f), [] {});
}

// How many copies of a kernel's buffers to cycle through so that each
// call starts from data outside the core's private cache, as a step's ops
// do (each reads what others wrote, and weights unused since the last
// micro-batch): at least four times the L2 cache over all copies. (A GPU's
// L2 is larger than a core's, and the shapes measured there are larger.)
inline int copies(double bytes) {
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l2 <= 0) l2 = 2 << 20;
  return static_cast<int>(std::clamp(std::ceil(4.0 * static_cast<double>(l2) / bytes), 1.0, 16.0));
}

// Small values of both signs (a GPU runs faster on zeros).
inline std::vector<float> values(double n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 13) - 0.06f;
  return v;
}

}  // namespace mpiformer::calibration
