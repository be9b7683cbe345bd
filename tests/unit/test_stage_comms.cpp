// The communicators connect_stage hands a stage work on the memory its
// buffers live in, one-rank groups included: a GPU stage given a host MPI
// communicator has MPI read device pointers from the host (ZeRO's
// reduce-scatter at dp = 1 crashed that way). Here on the host back end:
// a one-rank grid's groups are host MPI and pass the check for a host
// stage, and the same groups are refused, by name, for a device stage.
// tests/gpu/test_gpu_stage_comms.cpp checks the device side on a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <stdexcept>
#include <string>

#include "tiny_deck.hpp"
#include "train/backend_factory.hpp"

namespace mpiformer::test {
namespace {

TEST(StageComms, OneRankGroupsOfAHostStageAreHostMemory) {
  const Deck deck = tiny_stage_deck(1);
  ProcessGrid grid(1, 1, 1, MPI_COMM_SELF);
  const auto stage =
      make_stage_backend(deck, BackendChoice{}, deck.model, GridPlace{}, SlotKinds::any(1));
  ASSERT_FALSE(stage->on_device());
  const StageComms c = connect_stage(grid, *stage);
  for (const Communicator* comm : {c.pipe_act, c.pipe_grad, c.dp, c.tp}) {
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->size(), 1);
    EXPECT_EQ(comm->buffers(), MemorySpace::kHost);
  }
  EXPECT_NO_THROW(check_memory_spaces(c, false));
  // What the GPU path did before: the one-rank groups' MPI communicators
  // handed to a device stage. The check names the first such group.
  try {
    check_memory_spaces(c, true);
    FAIL() << "host communicators were accepted for a device stage";
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("activations group (1 rank(s)) was given a communicator of host memory"),
              std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace mpiformer::test
