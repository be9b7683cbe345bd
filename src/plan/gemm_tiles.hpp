// How fast a GPU multiplies a product of a given shape, from the machine
// file's tiles (io/machine_file.hpp: [compute] multiprocessors,
// matmul_tiles) where no measured shape is near. A GEMM library splits the
// output into tiles, one per multiprocessor at a time: a shape that is not
// a whole number of tiles computes the padding too (tile quantization),
// and one whose tiles leave the last round of multiprocessors part idle
// waits for that round all the same (wave quantization). The library picks
// the tile that finishes first, a smaller one when the large one wastes
// more than it gains. NVIDIA's "Matrix Multiplication Background" user's
// guide (DU-09799-001) describes both effects; the per-tile rates are the
// file's.
#pragma once
#include <cstdint>

#include "machine_file.hpp"

namespace mpiformer {

// The share of [compute] matmul_tflops a product whose output is rows x
// cols reaches (1 where the file gives no tiles): the best tile's rate
// times the output's share of the tile slots the waves occupy.
double tile_efficiency(const MachineSpec& machine, int64_t rows, int64_t cols);

}  // namespace mpiformer
