// The NCCL communicator against exact integer-valued data, on every rank's
// own GPU (run under mpirun with at most one rank per GPU: NCCL refuses two
// ranks on one device). Exits 77 (CTest: skipped) without a GPU.
#include <mpi.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "cuda/device.hpp"
#include "device_copy.hpp"
#include "core/cuda_check.hpp"
#include "parallel/mpi_session.hpp"
#include "parallel/host_staged_communicator.hpp"
#include "parallel/nccl_communicator.hpp"

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
    // This rank's GPU: its rank on the node, modulo the node's GPUs.
    CUDA_CHECK(cudaSetDevice(node_place(MPI_COMM_WORLD).rank % cuda::device_count()));
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MpiCommunicator group(dup);
    NcclCommunicator comm(group);
    const int n = comm.size(), r = comm.rank();
    std::vector<float> host(4096);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((r + 1) * (i % 5));
    cuda::DeviceBuffer<float> dev(host.size());
    cuda::copy_to_device(dev.get(), host.data(), host.size() * 4);
    comm.start_allreduce_sum(dev.get(), static_cast<int64_t>(host.size()))->wait();
    cuda::copy_to_host(host.data(), dev.get(), host.size() * 4);
    const float s = static_cast<float>(n * (n + 1) / 2);
    for (size_t i = 0; i < host.size(); ++i)
      if (host[i] != s * static_cast<float>(i % 5)) {
        std::printf("FAIL: element %zu is %g, want %g\n", i, host[i], s * (i % 5));
        rc = 1;
        break;
      }
    {
      // Sequence parallelism's pair, equal parts of 1000 floats: rank r's
      // part of the sum, then every rank's part gathered back in place.
      const int64_t part = 1000;
      std::vector<float> all(static_cast<size_t>(part * n));
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<float>((r + 1) * (i % 7));
      cuda::DeviceBuffer<float> whole(all.size()), mine(static_cast<size_t>(part));
      cuda::copy_to_device(whole.get(), all.data(), all.size() * 4);
      comm.reduce_scatter(whole.get(), mine.get(), part, Element::kF32);
      comm.allgather(mine.get(), whole.get(), part, Element::kF32);
      cuda::copy_to_host(all.data(), whole.get(), all.size() * 4);
      for (size_t i = 0; i < all.size(); ++i)
        if (all[i] != s * static_cast<float>(i % 7)) {
          std::printf("FAIL: reduce-scatter + all-gather element %zu is %g, want %g\n", i, all[i],
                      s * (i % 7));
          rc = 1;
          break;
        }
    }
    // Expert parallelism's exchange on NCCL and staged through the host:
    // rank r sends rank q (r + 1)(q + 2) - 2 bytes, byte i = 16 r + q + i.
    auto alltoallv = [&](Communicator& c, const char* what) {
      auto bytes = [](int from, int to) { return int64_t{from + 1} * (to + 2) - 2; };
      std::vector<int64_t> out_counts;
      std::vector<unsigned char> send;
      for (int q = 0; q < n; ++q) {
        out_counts.push_back(bytes(r, q));
        for (int64_t i = 0; i < bytes(r, q); ++i) send.push_back(static_cast<unsigned char>(r * 16 + q + i));
      }
      const std::vector<int64_t> in_counts = exchange_counts(group, out_counts);
      int64_t total = 0;
      for (const int64_t b : in_counts) total += b;
      cuda::DeviceBuffer<unsigned char> dsend(send.size() + 1), drecv(static_cast<size_t>(total) + 1);
      cuda::copy_to_device(dsend.get(), send.data(), send.size());
      c.alltoallv_bytes(dsend.get(), out_counts, drecv.get(), in_counts);
      std::vector<unsigned char> got(static_cast<size_t>(total));
      cuda::copy_to_host(got.data(), drecv.get(), got.size());
      size_t at = 0;
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < bytes(q, r); ++i, ++at)
          if (got[at] != static_cast<unsigned char>(q * 16 + r + i)) {
            std::printf("FAIL: %s all-to-all: byte %lld from rank %d\n", what,
                        static_cast<long long>(i), q);
            rc = 1;
            return;
          }
    };
    alltoallv(comm, "NCCL");
    {
      HostStagedCommunicator staged(group, nullptr);
      alltoallv(staged, "host-staged");
    }
    // A ring's steps (train/ring_attention.hpp): each rank's block visits
    // every rank, sent on as the previous rank's arrives; NCCL's send and
    // receive grouped, or the ring deadlocks.
    const auto ring = [&](Communicator& c, const char* what) {
      const size_t m = 1 << 18;
      std::vector<float> v(m, static_cast<float>(r));
      cuda::DeviceBuffer<float> a(m), b(m);
      cuda::copy_to_device(a.get(), v.data(), m * sizeof(float));
      float* held = a.get();
      float* arriving = b.get();
      for (int s = 1; s < n; ++s) {
        c.start_exchange_bytes(held, arriving, m * sizeof(float), (r + 1) % n, (r + n - 1) % n, s)->wait();
        CUDA_CHECK(cudaDeviceSynchronize());
        cuda::copy_to_host(v.data(), arriving, m * sizeof(float));
        const float want = static_cast<float>((r - s + n) % n);
        if (v[0] != want || v[m - 1] != want) {
          std::printf("FAIL: %s ring step %d gave %g, want %g\n", what, s, v[0], want);
          rc = 1;
          return;
        }
        std::swap(held, arriving);
      }
    };
    ring(comm, "NCCL");
    {
      HostStagedCommunicator staged(group, nullptr);
      ring(staged, "host-staged");
    }
    if (n > 1) {
      // A pipeline's two directions, each on its own communicator as the
      // trainer uses them: a value travels 0 -> n-1 on one, every rank adding
      // its rank, and back on the other, every rank adding 100 x its rank.
      NcclCommunicator down(group), up(group);
      cuda::DeviceBuffer<float> buf(256);
      std::vector<float> v(256, 0.f);
      auto add = [&](float x) {  // through the host: exact, and ordered by the copies
        cuda::copy_to_host(v.data(), buf.get(), 1024);
        for (auto& e : v) e += x;
        cuda::copy_to_device(buf.get(), v.data(), 1024);
      };
      if (r == 0) cuda::copy_to_device(buf.get(), v.data(), 1024);
      if (r > 0) down.recv(buf.get(), 256, r - 1, 0);
      add(static_cast<float>(r));
      if (r < n - 1) down.start_send(buf.get(), 256, r + 1, 0)->wait();
      if (r < n - 1) up.recv(buf.get(), 256, r + 1, 1);
      if (r > 0) add(100.f * static_cast<float>(r));
      if (r > 0) up.start_send(buf.get(), 256, r - 1, 1)->wait();
      if (r == 0) {
        cuda::copy_to_host(v.data(), buf.get(), 1024);
        const float want = 101.f * static_cast<float>(n * (n - 1) / 2);
        if (v[0] != want || v[255] != want) {
          std::printf("FAIL: pipeline round trip gave %g, want %g\n", v[0], want);
          rc = 1;
        }
      }
    }
    if (r == 0) std::printf("%s: NCCL all-reduce, reduce-scatter, all-gather, all-to-all, ring steps%s on %d rank(s)\n",
                            rc ? "FAILED" : "passed",
                            n > 1 ? " and a pipeline round trip" : "", n);
  }
  MPI_Finalize();
  return rc;
}
