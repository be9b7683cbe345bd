// The one-rank device communicator (parallel/local_device_communicator.hpp)
// against what each collective means for a group of one: sums and maxima
// leave the data as it is, reduce-scatters and gathers copy the one part to
// its destination (or nothing, in place), the exchange copies the one
// block, and anything naming a peer or a second part is refused. Runs on a
// GPU (gpu.local_comm) and under the CPU emulation (emulated.local_comm).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "core/cuda_check.hpp"
#include "cuda/device.hpp"
#include "device_copy.hpp"
#include "parallel/local_device_communicator.hpp"

namespace mpiformer::test {
namespace {

std::vector<float> pattern(int64_t n, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 23) * 0.5f + offset;
  return v;
}

struct DevFloats {
  cuda::DeviceBuffer<float> buf;
  explicit DevFloats(const std::vector<float>& v) : buf(v.size()) {
    cuda::copy_to_device(buf.get(), v.data(), v.size() * sizeof(float));
  }
  std::vector<float> read() {
    CUDA_CHECK(cudaDeviceSynchronize());  // the copies run on the compute stream
    std::vector<float> v(buf.size());
    cuda::copy_to_host(v.data(), buf.get(), v.size() * sizeof(float));
    return v;
  }
};

TEST(LocalDeviceCommunicator, CollectivesOfOneRank) {
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LocalDeviceCommunicator comm(stream);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.buffers(), MemorySpace::kDevice);
  const int64_t n = 1001;
  const auto a = pattern(n, 1.f), b = pattern(n, -7.f);

  DevFloats data(a);
  comm.allreduce_sum(data.buf.get(), n);
  comm.start_allreduce_sum(data.buf.get(), n)->wait();
  comm.allreduce(data.buf.get(), n, Element::kF32, Reduction::kMax);
  comm.start_allreduce(data.buf.get(), n, Element::kF32)->wait();
  EXPECT_EQ(data.read(), a) << "a sum over one rank changed the data";

  DevFloats send(a), recv(b);
  comm.start_reduce_scatter_sum(send.buf.get(), recv.buf.get(), {n})->wait();
  EXPECT_EQ(recv.read(), a) << "ZeRO's reduce-scatter at dp = 1";
  DevFloats gathered(b);
  comm.start_allgather(send.buf.get(), gathered.buf.get(), {n}, sizeof(float))->wait();
  EXPECT_EQ(gathered.read(), a) << "ZeRO's all-gather at dp = 1";
  comm.start_allgather(send.buf.get(), send.buf.get(), {n}, sizeof(float))->wait();
  EXPECT_EQ(send.read(), a) << "an all-gather in place";

  // The tensor group's pair, half the buffer in 16-bit elements.
  DevFloats part(b);
  comm.reduce_scatter(send.buf.get(), part.buf.get(), n, Element::kBf16);
  const auto got = part.read();
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + n / 2, got.begin()));
  EXPECT_TRUE(std::equal(b.begin() + n / 2, b.end(), got.begin() + n / 2)) << "wrote past its part";
  DevFloats part2(b);
  comm.start_reduce_scatter(send.buf.get(), part2.buf.get(), n, Element::kBf16)->wait();
  EXPECT_EQ(part2.read(), got);
  DevFloats all(b);
  comm.allgather(send.buf.get(), all.buf.get(), n, Element::kF32);
  EXPECT_EQ(all.read(), a);

  DevFloats out(b);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  comm.alltoallv_bytes(send.buf.get(), {bytes}, out.buf.get(), {bytes});
  EXPECT_EQ(out.read(), a) << "the experts' exchange with oneself";

  EXPECT_THROW(comm.start_allgather(send.buf.get(), out.buf.get(), {n, n}, 4), std::logic_error);
  EXPECT_THROW(comm.alltoallv_bytes(send.buf.get(), {bytes}, out.buf.get(), {bytes - 4}),
               std::logic_error);
  EXPECT_THROW(comm.start_send_bytes(send.buf.get(), 4, 0, 0), std::logic_error);
  EXPECT_THROW(comm.recv_bytes(out.buf.get(), 4, 0, 0), std::logic_error);
  CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace mpiformer::test
