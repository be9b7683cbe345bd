// Memory this process's node can still give, for the check that a deck fits
// before anything is allocated.
#pragma once

namespace mpiformer {

// Bytes available on this node: the kernel's MemAvailable, lowered to what
// the cgroup (Slurm's job step, a container) still allows; -1 if unknown.
double host_available_bytes();

}  // namespace mpiformer
