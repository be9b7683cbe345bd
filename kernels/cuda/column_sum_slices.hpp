// How the column sums (column_sums.cuh) cut the rows of an [N, C] input:
// a host-side choice, apart so host code and tests can ask it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace mpiformer::cuda {

// A column-sum block: kSumPacks packs of columns by kSumRows rows.
constexpr int kSumPacks = 32, kSumRows = 8;
constexpr int kMaxRowSlices = 64, kColumnSumTargetBlocks = 264;

// How many row slices a launch uses: enough blocks to fill the GPU, at
// least a block's rows (kSumRows) each, as many as the scratch holds.
// `columns`: the columns one block owns.
inline int column_sum_slices(int64_t N, int64_t C, int columns, size_t scratch_bytes) {
  const int64_t blocks = (C + columns - 1) / columns;
  int64_t R = std::min<int64_t>({kMaxRowSlices, (kColumnSumTargetBlocks + blocks - 1) / blocks,
                                 N / kSumRows});
  R = std::min<int64_t>(R, static_cast<int64_t>(scratch_bytes / (2 * sizeof(float) * C)));
  return static_cast<int>(std::max<int64_t>(R, 1));
}

}  // namespace mpiformer::cuda
