#include "core/host_memory.hpp"

#include <algorithm>
#include <fstream>
#include <string>

namespace mpiformer {

namespace {

// The first number in `path` (-1: absent or "max").
double read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return -1;
  try {
    return std::stod(word);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

double host_available_bytes() {
  double avail = -1;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") avail = kib * 1024;
    meminfo.ignore(1 << 10, '\n');
  }
  // cgroup v2, then v1: a limit below the node's memory is the real one.
  for (const auto& [limit, usage] :
       {std::pair<std::string, std::string>{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const double max = read_number(limit), used = read_number(usage);
    if (max > 0 && used >= 0 && max < 1e18) {
      const double left = std::max(0.0, max - used);
      avail = avail < 0 ? left : std::min(avail, left);
    }
  }
  return avail;
}

}  // namespace mpiformer
