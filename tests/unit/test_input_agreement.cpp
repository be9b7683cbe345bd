// Input agreement at 1, 2 and 4 ranks: one rank's failure or one rank's
// different view of a file becomes the same InputError on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "core/error.hpp"
#include "parallel/input_agreement.hpp"

namespace mpiformer::test {
namespace {

// world_rank() is core's (mpi_check.hpp).
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

TEST(InputAgreement, TheSameViewPasses) {
  EXPECT_NO_THROW(agree_on_view(MPI_COMM_WORLD, "HDF5, 1000 tokens", "d.h5", "header"));
}

TEST(InputAgreement, ADifferentViewOnTheLastRankFailsEveryRank) {
  const int last = world_size() - 1;
  if (last == 0) GTEST_SKIP() << "needs 2 ranks";
  const std::string mine = world_rank() == last ? "HDF5, 999 tokens" : "HDF5, 1000 tokens";
  try {
    agree_on_view(MPI_COMM_WORLD, mine, "d.h5", "header");
    ADD_FAILURE() << "no error on rank " << world_rank();
  } catch (const InputError& e) {
    const std::string want = "d.h5: header: differs between ranks";
    EXPECT_EQ(std::string(e.what()).find(want), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0 reads HDF5, 1000 tokens, rank " +
                                         std::to_string(last) + " reads HDF5, 999 tokens"),
              std::string::npos) << e.what();
  }
}

TEST(InputAgreement, OneRanksErrorIsEveryRanks) {
  const int last = world_size() - 1;
  try {
    agree_on_input_errors(MPI_COMM_WORLD, [&] {
      if (world_rank() == last) throw InputError("x.toml", "[train] lr", "bad");
    });
    ADD_FAILURE() << "no error on rank " << world_rank();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find("x.toml: [train] lr: bad"), 0u) << e.what();
  }
}

TEST(InputAgreement, BroadcastStringFromAnyRoot) {
  const int root = world_size() - 1;
  std::string s = world_rank() == root ? std::string(100000, 'z') + "end" : "other";
  broadcast_string(MPI_COMM_WORLD, s, root);
  EXPECT_EQ(s, std::string(100000, 'z') + "end");
}

}  // namespace
}  // namespace mpiformer::test
