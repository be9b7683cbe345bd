#include "plan/gemm_tiles.hpp"

#include <algorithm>

namespace mpiformer {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

double tile_efficiency(const MachineSpec& machine, int64_t rows, int64_t cols) {
  if (machine.matmul_tiles.empty() || machine.multiprocessors <= 0 || rows <= 0 || cols <= 0)
    return 1;
  const int64_t sms = machine.multiprocessors;
  double best = 0;
  for (const MatmulTile& t : machine.matmul_tiles) {
    // Either orientation: the library transposes the product as it likes.
    for (const auto& [r, c] : {std::pair{t.rows, t.cols}, std::pair{t.cols, t.rows}}) {
      const int64_t tiles = ceil_div(rows, r) * ceil_div(cols, c);
      const double slots = static_cast<double>(ceil_div(tiles, sms) * sms) * static_cast<double>(r * c);
      best = std::max(best, t.rate * static_cast<double>(rows) * static_cast<double>(cols) / slots);
    }
  }
  return best;
}

}  // namespace mpiformer
