// A GPU stage on a one-rank grid, with ZeRO 1: every group connect_stage
// hands it works on device memory (before the fix, the one-rank groups kept
// their host MPI communicators and ZeRO's reduce-scatter at dp = 1 had MPI
// read device pointers: a crash on every GPU run with zero >= 1 and
// dp = 1), and the data-parallel group's reduce-scatter and all-gather
// move device buffers exactly (one rank: each is a copy). The host side of
// the check is tests/unit/test_stage_comms.cpp. Exits 77 (CTest: skipped)
// without a GPU.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "cuda/device.hpp"
#include "device_copy.hpp"
#include "../unit/tiny_deck.hpp"
#include "train/backend_factory.hpp"

int main(int argc, char** argv) {
  using namespace mpiformer;
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    std::string why;
    if (cuda::device_count(&why) == 0) {
      std::printf("SKIP: no usable GPU (%s)\n", why.c_str());
      MPI_Finalize();
      return 77;
    }
    Deck deck = test::tiny_stage_deck(1);
    deck.run.device = Device::kCuda;
    const BackendChoice choice = choose_backend(deck, node_place(MPI_COMM_WORLD));
    ProcessGrid grid(1, 1, 1, MPI_COMM_SELF);
    auto stage = make_stage_backend(deck, choice, deck.model, GridPlace{}, SlotKinds::any(1));
    StageComms c = connect_stage(grid, *stage);
    const char* names[] = {"activations", "gradients", "data-parallel", "tensor-parallel"};
    const Communicator* comms[] = {c.pipe_act, c.pipe_grad, c.dp, c.tp};
    for (int i = 0; i < 4; ++i) {
      if (comms[i] == nullptr || comms[i]->buffers() != MemorySpace::kDevice) {
        std::printf("FAIL: the %s group's communicator does not take device memory\n", names[i]);
        rc = 1;
      }
    }
    std::printf("comms: %s\n", c.description.c_str());
    // ZeRO's pair through the data-parallel group, on device buffers.
    const int64_t n = 1000;
    std::vector<float> host(n), back(n, -1.f);
    for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 17) - 3.f;
    cuda::DeviceBuffer<float> send(n), recv(n), gathered(n);
    cuda::copy_to_device(send.get(), host.data(), n * 4);
    c.dp->start_reduce_scatter_sum(send.get(), recv.get(), {n})->wait();
    c.dp->start_allgather(recv.get(), gathered.get(), {n}, 4)->wait();
    // The operations are ordered on the stage's streams; the copy below
    // runs on the legacy stream, which does not wait for non-blocking ones.
    CUDA_CHECK(cudaDeviceSynchronize());
    cuda::copy_to_host(back.data(), gathered.get(), n * 4);
    if (back != host) {
      std::printf("FAIL: a one-rank reduce-scatter and all-gather changed the data\n");
      rc = 1;
    }
    std::printf("%s: a GPU stage's one-rank groups are device communicators\n",
                rc ? "FAILED" : "passed");
  }
  MPI_Finalize();
  return rc;
}
