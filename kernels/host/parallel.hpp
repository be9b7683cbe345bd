// The host kernels' loop primitives. Where the installed Kokkos has a
// threaded host back end (OpenMP or Threads, as on clusters) its execution
// space runs them; Debian's Kokkos is Serial-only, and there OpenMP runs
// them directly. Every loop body writes only its own index and each sum
// is formed in a fixed order, so results do not depend on the thread count
// (tests compare runs bit for bit across layouts and resumes).
//
// The thread count is the rank's compute threads (gemm.hpp's
// set_compute_threads), shared with oneDNN (the same OpenMP runtime). A
// body that calls the BLAS must not run inside parallel_for (the BLAS
// threads itself): task_for runs such bodies.
#pragma once
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace mpiformer::host {

#if defined(KOKKOS_ENABLE_OPENMP) || defined(KOKKOS_ENABLE_THREADS)
#define MPIFORMER_LOOPS_KOKKOS 1
#endif

// Told of each labelled loop (bench/bench_step.cpp's per-kernel times);
// null in a run.
struct LoopObserver {
  void (*begin)(const char* label) = nullptr;
  void (*end)() = nullptr;
};
inline LoopObserver& loop_observer() {
  static LoopObserver o;
  return o;
}

template <class F>
inline void parallel_for(const char* label, int64_t n, const F& body) {
#ifdef _OPENMP
  if (omp_in_parallel()) {  // inside a task_for task: on its thread, timed with it
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#endif
  const LoopObserver& o = loop_observer();
  if (o.begin != nullptr) o.begin(label);
#ifdef MPIFORMER_LOOPS_KOKKOS
  using Range = Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::IndexType<int64_t>>;
  Kokkos::parallel_for(label, Range(0, n), body);
#else
  // Static: one contiguous share per thread, no scheduling overhead for
  // the many short loops of a step. Not worth waking threads for a few
  // iterations.
#pragma omp parallel for schedule(static) if (n > 1)
  for (int64_t i = 0; i < n; ++i) body(i);
#endif
  if (o.end != nullptr) o.end();
}

// Independent tasks whose bodies multiply matrices. `side_by_side` (the
// products run single-threaded inside a parallel region: gemm.hpp's
// gemm_serial_in_parallel_region) spreads them over the rank's threads,
// one product per thread; otherwise they run in index order on the calling
// thread and each product is threaded by its library. Loops inside a task run on the
// task's thread (parallel_for).
template <class F>
inline void task_for(int64_t n, bool side_by_side, const F& body) {
#ifdef _OPENMP
  if (side_by_side) {
#pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#else
  (void)side_by_side;
#endif
  for (int64_t i = 0; i < n; ++i) body(i);
}

// Sum of f(i) over [0, n), accumulated in double in index order whatever
// the threads: each term is computed in parallel, then added up in order.
// n is a count of chunks (a few thousand at most), each term a chunk's sum.
template <class F>
inline double parallel_sum(const char* label, int64_t n, const F& term) {
  std::vector<double> terms(static_cast<size_t>(n));
  double* t = terms.data();
  parallel_for(label, n, [=](const int64_t i) { t[i] = term(i); });
  double total = 0.0;
  for (double x : terms) total += x;
  return total;
}

}  // namespace mpiformer::host
