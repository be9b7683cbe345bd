// GoogleTest main for the GPU test binaries: exits 77 (CTest: skipped), with
// the reason, where no GPU is usable; otherwise Kokkos (the host reference
// kernels run on it), then the tests.
#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cuda/device.hpp"

int main(int argc, char** argv) {
  std::string why;
  if (mpiformer::cuda::device_count(&why) == 0) {
    std::printf("SKIP: no usable GPU (%s)\n", why.c_str());
    return 77;
  }
  Kokkos::ScopeGuard kokkos(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
