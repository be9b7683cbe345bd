// The CPU emulation of CUDA against what CUDA guarantees: the results of
// barrier and shuffle code, thread and block indices, barriers after some
// threads exit, and a loud error (never a hang) for barriers that cannot
// all complete. Exact results: integer-valued data.
#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>
#include <vector>

#include "emulator_selftest.hpp"

namespace {

TEST(Emulation, BlockBarrierOverSharedMemory) {
  std::vector<float> in(3 * 256), out(in.size(), -1.f);
  std::iota(in.begin(), in.end(), 0.f);
  emu_test::reverse(out.data(), in.data(), 3);
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 256; ++t) ASSERT_EQ(out[b * 256 + t], in[b * 256 + 255 - t]);
}

TEST(Emulation, WarpShuffleReduction) {
  std::vector<float> in(128), out(128, -1.f);
  std::iota(in.begin(), in.end(), 0.f);
  emu_test::warp_sum(out.data(), in.data(), 128);
  for (int w = 0; w < 4; ++w) {
    float want = 0;
    for (int l = 0; l < 32; ++l) want += in[w * 32 + l];
    for (int l = 0; l < 32; ++l) ASSERT_EQ(out[w * 32 + l], want) << "warp " << w;
  }
}

TEST(Emulation, MultiDimensionalIndices) {
  std::vector<int> out(2 * 32, -1);
  emu_test::indices(out.data(), 2);
  for (int b = 0; b < 2; ++b)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 8; ++x) ASSERT_EQ(out[(b * 4 + y) * 8 + x], x + 10 * y + 100 * b);
}

TEST(Emulation, ExitedThreadsDoNotHoldABarrier) {
  std::vector<int> out(256, -1);
  emu_test::early_exit(out.data(), 96);
  for (int t = 0; t < 96; ++t) ASSERT_EQ(out[t], 95 - t);
  for (int t = 96; t < 256; ++t) ASSERT_EQ(out[t], -1);
}

TEST(Emulation, BarriersThatCannotCompleteAreReported) {
  std::vector<int> out(64, 0);
  EXPECT_THROW(emu_test::mismatched_barriers(out.data()), std::logic_error);
  // The scheduler is usable again afterwards.
  std::vector<float> in(64, 1.f), sums(64, 0.f);
  emu_test::warp_sum(sums.data(), in.data(), 64);
  EXPECT_EQ(sums[0], 32.f);
}

}  // namespace
