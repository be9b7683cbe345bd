// The host-staged communicator (ranks sharing one GPU: device buffers
// moved by MPI through page-locked host memory) against what each
// operation means, at 2 and 4 ranks, on data whose sums are exact small
// integers: every collective, the exchange of uneven blocks, and sends
// and receives several at a time (the send buffers' pool), each operation
// right after the last (the staging buffer's copy down must be done
// before it is written again). Runs on a GPU (gpu.host_staged, ranks
// sharing it) and under the CPU emulation (emulated.host_staged), where
// device memory is the host's. Exits 77 without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "cuda/device.hpp"
#include "device_copy.hpp"
#include "parallel/host_staged_communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace mpiformer::test {
namespace {

// A device copy of `v`, and back.
template <class T>
struct Dev {
  cuda::DeviceBuffer<T> buf;
  explicit Dev(const std::vector<T>& v) : buf(v.size()) {
    cuda::copy_to_device(buf.get(), v.data(), v.size() * sizeof(T));
  }
  std::vector<T> read() {
    CUDA_CHECK(cudaDeviceSynchronize());  // the copies down run on the compute stream
    std::vector<T> v(buf.size());
    cuda::copy_to_host(v.data(), buf.get(), v.size() * sizeof(T));
    return v;
  }
};

struct Staged {
  MPI_Comm dup = MPI_COMM_NULL;
  cudaStream_t stream = nullptr;
  std::unique_ptr<MpiCommunicator> group;
  std::unique_ptr<HostStagedCommunicator> comm;
  Staged() {
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    group = std::make_unique<MpiCommunicator>(dup);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    comm = std::make_unique<HostStagedCommunicator>(*group, stream);
  }
  ~Staged() {
    comm.reset();
    cudaStreamDestroy(stream);
  }
};

TEST(HostStagedCommunicator, CollectivesAreExact) {
  Staged s;
  HostStagedCommunicator& c = *s.comm;
  const int n = c.size(), r = c.rank();
  const int64_t len = 1000;
  std::vector<float> mine(len);
  for (int64_t i = 0; i < len; ++i) mine[i] = static_cast<float>((r + 1) * (i % 7));
  const float ranks = static_cast<float>(n * (n + 1) / 2);
  Dev<float> a(mine), b(mine);
  c.allreduce_sum(a.buf.get(), len);
  c.start_allreduce_sum(b.buf.get(), len)->wait();  // at once: the staging buffer reused
  const auto got_a = a.read(), got_b = b.read();
  for (int64_t i = 0; i < len; ++i) {
    ASSERT_EQ(got_a[i], ranks * static_cast<float>(i % 7)) << i;
    ASSERT_EQ(got_b[i], got_a[i]) << i;
  }
  // Reduce-scatter of uneven parts (rank q's: q + 3 elements), then the
  // parts gathered back, in place.
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int q = 0; q < n; ++q) counts.push_back(q + 3), total += q + 3;
  std::vector<float> all(total);
  for (int64_t i = 0; i < total; ++i) all[i] = static_cast<float>((r + 1) * i);
  Dev<float> send(all), part(std::vector<float>(counts[r], -1.f));
  c.start_reduce_scatter_sum(send.buf.get(), part.buf.get(), counts)->wait();
  int64_t before = 0;
  for (int q = 0; q < r; ++q) before += counts[q];
  const auto got_part = part.read();
  for (int64_t i = 0; i < counts[r]; ++i) ASSERT_EQ(got_part[i], ranks * static_cast<float>(before + i));
  std::vector<float> gathered(total, -1.f);
  for (int64_t i = 0; i < counts[r]; ++i) gathered[before + i] = got_part[i];
  Dev<float> g(gathered);
  c.start_allgather(g.buf.get() + before, g.buf.get(), counts, sizeof(float))->wait();
  const auto got_g = g.read();
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(got_g[i], ranks * static_cast<float>(i)) << i;
  // The tensor group's pair of equal parts.
  const int64_t p = 5;
  std::vector<float> parts(p * n);
  for (int64_t i = 0; i < p * n; ++i) parts[i] = static_cast<float>(r + i);
  Dev<float> ps(parts), pr(std::vector<float>(p, 0.f)), pg(std::vector<float>(p * n, 0.f));
  c.reduce_scatter(ps.buf.get(), pr.buf.get(), p, Element::kF32);
  const auto got_pr = pr.read();
  for (int64_t i = 0; i < p; ++i)
    ASSERT_EQ(got_pr[i], static_cast<float>(n * (p * r + i) + n * (n - 1) / 2));
  c.allgather(pr.buf.get(), pg.buf.get(), p, Element::kF32);
  const auto got_pg = pg.read();
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < p; ++i)
      ASSERT_EQ(got_pg[q * p + i], static_cast<float>(n * (p * q + i) + n * (n - 1) / 2));
}

// Rank r sends rank q (r + 1) (q + 2) bytes, byte i of it r * 16 + q + i.
TEST(HostStagedCommunicator, ExchangesUnevenBlocks) {
  Staged s;
  HostStagedCommunicator& c = *s.comm;
  const int n = c.size(), r = c.rank();
  auto bytes = [](int from, int to) { return int64_t{from + 1} * (to + 2); };
  std::vector<int64_t> out, in;
  std::vector<unsigned char> send;
  int64_t in_total = 0;
  for (int q = 0; q < n; ++q) {
    out.push_back(bytes(r, q));
    in.push_back(bytes(q, r));
    in_total += bytes(q, r);
    for (int64_t i = 0; i < bytes(r, q); ++i) send.push_back(static_cast<unsigned char>(r * 16 + q + i));
  }
  Dev<unsigned char> ds(send), dr(std::vector<unsigned char>(in_total, 0));
  c.alltoallv_bytes(ds.buf.get(), out, dr.buf.get(), in);
  const auto got = dr.read();
  int64_t at = 0;
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < bytes(q, r); ++i, ++at)
      ASSERT_EQ(got[at], static_cast<unsigned char>(q * 16 + r + i)) << "from " << q;
}

// Three sends in flight at once to the next rank (each from its own
// pooled buffer), received in order from the previous one; then again,
// so pooled buffers are reused.
TEST(HostStagedCommunicator, SendsInFlightKeepTheirData) {
  Staged s;
  HostStagedCommunicator& c = *s.comm;
  const int n = c.size(), r = c.rank();
  if (n < 2) GTEST_SKIP() << "one rank has no peer";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int round = 0; round < 2; ++round) {
    std::vector<Dev<float>> out;
    std::vector<Pending> sends;
    for (int k = 0; k < 3; ++k) out.emplace_back(std::vector<float>(100, static_cast<float>(r * 10 + k + round)));
    for (int k = 0; k < 3; ++k) sends.push_back(c.start_send(out[k].buf.get(), 100, next, k));
    for (int k = 0; k < 3; ++k) {
      Dev<float> in(std::vector<float>(100, -1.f));
      c.recv(in.buf.get(), 100, prev, k);
      for (const float x : in.read()) ASSERT_EQ(x, static_cast<float>(prev * 10 + k + round));
    }
    for (auto& p : sends) p->wait();
  }
}

// A ring's steps, as train/ring_attention.hpp takes them: each block
// visits every rank, sent on as the previous rank's arrives.
TEST(HostStagedCommunicator, RingExchangePassesEveryBlockRound) {
  Staged s;
  HostStagedCommunicator& c = *s.comm;
  const int n = c.size(), r = c.rank();
  Dev<float> a(std::vector<float>(1000, static_cast<float>(r))), b(std::vector<float>(1000, -1.f));
  Dev<float>* held = &a;
  Dev<float>* arriving = &b;
  for (int step = 1; step < n; ++step) {
    c.start_exchange_bytes(held->buf.get(), arriving->buf.get(), 4000, (r + 1) % n, (r + n - 1) % n, step)
        ->wait();
    for (const float x : arriving->read()) ASSERT_EQ(x, static_cast<float>((r - step + n) % n)) << "step " << step;
    std::swap(held, arriving);
  }
}

}  // namespace
}  // namespace mpiformer::test
