// What both back ends' Mixture-of-Experts routers (host/moe_router.hpp,
// cuda/moe_router.hpp) take and report; the definitions are in the host's.
#pragma once
#include <cstdint>

namespace mpiformer {

struct RouterShape {
  int64_t tokens = 0;    // N rows
  int64_t seq_len = 0;   // T: rows per sequence (N a multiple of it)
  int64_t experts = 0;   // E
  int64_t top_k = 0;     // k <= E
  int64_t capacity = 0;  // per expert per sequence; 0: no limit
};

// What a call adds to `totals` (kRouterTotals doubles, +=), summed over
// its sequences: the aux loss's sum_s aux(s), the z loss's sum_n z(n), the
// assignments dropped over capacity.
enum RouterTotal : int { kAuxSum, kZSum, kDropped, kRouterTotals };

}  // namespace mpiformer
