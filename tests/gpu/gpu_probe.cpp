// Exit 0 when a GPU is usable, else 77 (CTest: skipped) with the reason:
// the GPU shell tests call this first. With --nccl (bench/gpu-check.sh's
// preflight) it also starts a one-rank NCCL communicator on GPU 0 and says
// whether that worked (exit 3 if not): only groups with peers need NCCL,
// so a failure there explains multi-GPU failures, not one-GPU ones.
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "cuda/device.hpp"

int main(int argc, char** argv) {
  std::string why;
  const int n = mpiformer::cuda::device_count(&why);
  if (n == 0) {
    std::printf("SKIP: no usable GPU (%s)\n", why.c_str());
    return 77;
  }
  std::printf("%d GPU(s)\n", n);
  if (argc > 1 && std::strcmp(argv[1], "--nccl") == 0) {
    int version = 0;
    ncclGetVersion(&version);
    ncclComm_t comm = nullptr;
    const int devices[1] = {0};
    const ncclResult_t r = ncclCommInitAll(&comm, 1, devices);
    if (r != ncclSuccess) {
      std::printf("NCCL %d: a one-rank communicator failed: %s (%s)\n", version,
                  ncclGetErrorString(r), ncclGetLastError(nullptr));
      return 3;
    }
    ncclCommDestroy(comm);
    std::printf("NCCL %d: a one-rank communicator started\n", version);
  }
  return 0;
}
