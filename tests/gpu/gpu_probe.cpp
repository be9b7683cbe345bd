// Exit 0 when a GPU is usable, else 77 (CTest: skipped) with the reason:
// the GPU shell tests call this first.
#include <cstdio>
#include <string>

#include "cuda/device.hpp"

int main() {
  std::string why;
  const int n = mpiformer::cuda::device_count(&why);
  if (n == 0) {
    std::printf("SKIP: no usable GPU (%s)\n", why.c_str());
    return 77;
  }
  std::printf("%d GPU(s)\n", n);
  return 0;
}
