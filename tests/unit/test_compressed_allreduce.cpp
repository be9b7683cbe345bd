// [train] grad_compression's all-reduce (train/compressed_allreduce.hpp) on
// the host, at 1, 2 and 4 ranks, against sums in double of the same
// gradients: within what the format loses (bf16: every value and the sum
// each rounded once to 8 bits of mantissa; int8: half a quantum of each
// block's scale, amax / 127, from every rank and from the sum), the same
// bits on every rank, and error feedback: the same gradient reduced T times
// sums to T times its sum within a few quanta, whatever T (without it the
// rounding would pile up T times).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "host/ops.hpp"
#include "model/gradient_buckets.hpp"
#include "parallel/mpi_communicator.hpp"
#include "reference.hpp"
#include "train/compressed_allreduce.hpp"

namespace mpiformer::test {
namespace {

using HostOps = host::Ops<float>;

MpiCommunicator world_copy() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return MpiCommunicator(c);
}

// Buckets of a made-up stage: 1000 elements in three buckets, one shorter
// than 4 (some ranks sum an empty chunk), one across quantisation blocks.
std::vector<GradientBucket> buckets() { return {{997, 1000}, {300, 997}, {0, 300}}; }

std::vector<float> gradients(int rank, uint64_t seed) {
  const auto r = random_vector(1000, static_cast<unsigned>(seed * 100 + static_cast<uint64_t>(rank)));
  return std::vector<float>(r.begin(), r.end());  // normal, unit variance
}

// The bound on one element's error for g ranks whose values are at most A
// in magnitude: bf16 rounds each part and the sum, each by at most 2^-8 of
// it (|part| <= A, |sum| <= g A); int8 loses at most half a quantum of each
// part's block (A / 127) and of the sum's (g A / 127).
double bound(GradCompression kind, int g, double A) {
  return kind == GradCompression::kBf16 ? std::ldexp(1.0, -8) * (g * A + g * A) * 1.01
                                        : 0.5 * (g * A + g * A) / 127.0 * 1.01;
}
// The largest magnitude of any rank's gradients.
double largest(int g, uint64_t seed) {
  double A = 0;
  for (int r = 0; r < g; ++r)
    for (float v : gradients(r, seed)) A = std::max(A, static_cast<double>(std::fabs(v)));
  return A;
}

std::vector<float> gathered(MpiCommunicator& comm, const std::vector<float>& mine) {
  std::vector<float> all(mine.size() * static_cast<size_t>(comm.size()));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, all.data(),
                static_cast<int>(mine.size()), MPI_FLOAT, MPI_COMM_WORLD);
  return all;
}

TEST(CompressedAllReduce, SumsWithinTheFormatsErrorAndTheSameBitsEverywhere) {
  MpiCommunicator comm = world_copy();
  const int g = comm.size();
  for (GradCompression kind : {GradCompression::kBf16, GradCompression::kInt8}) {
    host::Context ctx;
    CompressedAllReduce<HostOps> reduce(ctx, kind, buckets(), 1000, g, g);
    std::vector<float> grads = gradients(comm.rank(), 1);
    std::vector<double> want(1000, 0.0);
    for (int r = 0; r < g; ++r) {
      const auto x = gradients(r, 1);
      for (size_t i = 0; i < x.size(); ++i) want[i] += x[i];
    }
    const auto list = buckets();
    for (size_t b = 0; b < list.size(); ++b) reduce.reduce(grads.data(), list[b].begin, list[b].end, b, comm);
    double worst = 0;
    for (size_t i = 0; i < grads.size(); ++i) worst = std::max(worst, std::fabs(grads[i] - want[i]));
    EXPECT_LE(worst, bound(kind, g, largest(g, 1))) << name_of(kind) << " at " << g << " ranks";
    if (g > 1) {
      EXPECT_GT(worst, 0.0) << name_of(kind) << ": compressed sums are not exact";
    }
    const auto all = gathered(comm, grads);
    for (int r = 1; r < g; ++r)
      ASSERT_TRUE(std::equal(all.begin(), all.begin() + 1000, all.begin() + r * 1000))
          << name_of(kind) << ": rank " << r << " differs";
    // The bytes sent: 2 (g - 1) chunks of each bucket, in the format's width
    // (bf16: 2 bytes an element; int8: 1, and a float per 256).
    double sent = 0;
    for (const GradientBucket& b : list)
      sent += 2.0 * (g - 1) *
              static_cast<double>(compressed_chunk_bytes(kind == GradCompression::kInt8,
                                                         chunk_elements(b.end - b.begin, g)));
    EXPECT_EQ(reduce.take_sent_bytes(), sent);
  }
}

TEST(CompressedAllReduce, ErrorFeedbackKeepsTheRunningSumTrue) {
  MpiCommunicator comm = world_copy();
  const int g = comm.size(), T = 24;
  for (GradCompression kind : {GradCompression::kBf16, GradCompression::kInt8}) {
    host::Context ctx;
    CompressedAllReduce<HostOps> reduce(ctx, kind, buckets(), 1000, g, g);
    const std::vector<float> grads = gradients(comm.rank(), 2);
    std::vector<double> want(1000, 0.0);
    for (int r = 0; r < g; ++r) {
      const auto x = gradients(r, 2);
      for (size_t i = 0; i < x.size(); ++i) want[i] += static_cast<double>(T) * x[i];
    }
    // T steps, with the residuals carried or (`feedback` false) forgotten.
    auto worst_after = [&](bool feedback) {
      reduce.forget();
      std::vector<double> got(1000, 0.0);
      for (int t = 0; t < T; ++t) {
        if (!feedback) reduce.forget();
        std::vector<float> step = grads;
        const auto list = buckets();
        for (size_t b = 0; b < list.size(); ++b)
          reduce.reduce(step.data(), list[b].begin, list[b].end, b, comm);
        for (size_t i = 0; i < step.size(); ++i) got[i] += step[i];
      }
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
      return worst;
    };
    const double with = worst_after(true);
    // What is left in the residuals, not T times the one-step error...
    EXPECT_LE(with, 2 * bound(kind, g, largest(g, 2))) << name_of(kind) << " at " << g << " ranks";
    // ...which is what piles up without the feedback.
    EXPECT_GT(worst_after(false), 4 * with) << name_of(kind) << " at " << g << " ranks";
    // Forgotten, the residuals are zero: a step then is the one-step error.
    reduce.forget();
    for (const auto& [p, n] : reduce.residuals())
      EXPECT_TRUE(std::all_of(p, p + n, [](float v) { return v == 0.0f; }));
  }
}

}  // namespace
}  // namespace mpiformer::test
