// Launchers of the emulator's own test kernels (emulator_selftest.cu).
#pragma once

namespace emu_test {

void reverse(float* out, const float* in, int blocks);  // blocks of 256
void warp_sum(float* out, const float* in, int n);      // n a multiple of 64
void indices(int* out, int blocks);                     // blocks of 8 x 4
void early_exit(int* out, int live);                    // one block of 256
void mismatched_barriers(int* out);                     // one block of 64

}  // namespace emu_test
