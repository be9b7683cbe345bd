#include "parallel/nccl_version.hpp"

#ifdef MPIFORMER_HAVE_NCCL
#include <nccl.h>
#endif

namespace mpiformer {

std::string nccl_version() {
#ifdef MPIFORMER_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
#else
  return "none";
#endif
}

}  // namespace mpiformer
