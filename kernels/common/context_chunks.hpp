// Context parallelism's causal balance: the sequence cut into 2 cp chunks,
// rank r holding chunks r and 2 cp - 1 - r (one from the front, one from
// the back), so every rank's queries see as many keys. The data feeder
// lays a rank's tokens out by it and the ring attends by it.
#pragma once
#include <cstdint>

namespace mpiformer::host {

struct HeadTailChunks {
  int64_t first, second;
};
inline HeadTailChunks head_tail_chunks(int64_t rank, int64_t cp) { return {rank, 2 * cp - 1 - rank}; }

}  // namespace mpiformer::host
