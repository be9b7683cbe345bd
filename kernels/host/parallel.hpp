// The host kernels' loop primitives: Kokkos on the host execution space
// (Serial in Debian's build; OpenMP where a cluster's Kokkos has it). Every
// loop body writes only its own index, so results do not depend on the
// back end's thread count: reductions use Kokkos' deterministic ordering on
// Serial and are only used where a few ulps of difference are harmless.
#pragma once
#include <Kokkos_Core.hpp>
#include <cstdint>

namespace mpiformer::host {

using HostSpace = Kokkos::DefaultHostExecutionSpace;
using Range = Kokkos::RangePolicy<HostSpace, Kokkos::IndexType<int64_t>>;

template <class F>
inline void parallel_for(const char* label, int64_t n, const F& body) {
  Kokkos::parallel_for(label, Range(0, n), body);
}

// Sum of f(i) over [0, n), accumulated in double.
template <class F>
inline double parallel_sum(const char* label, int64_t n, const F& term) {
  double total = 0.0;
  Kokkos::parallel_reduce(
      label, Range(0, n), [&](const int64_t i, double& acc) { acc += term(i); }, total);
  return total;
}

}  // namespace mpiformer::host
