// `mpiformer calibrate` on a GPU (cuda build): the host's measurements
// (calibrate_kernels.hpp, calibrate_links.hpp) over the CUDA op set and
// the GPU's communicators, plus what only a GPU has: its bf16 and fp32
// GEMM peaks, its memory, its link to page-locked host memory ([offload]
// host_link_gbs), and the memory a GPU rank holds outside our
// allocator (CUDA context, cuBLAS, NCCL). Real stages are not probed here:
// the planner's stage factor stays 1 on GPUs until one is measured.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/mpi_check.hpp"
#include "cuda/context.hpp"
#include "cuda/device.hpp"
#include "cuda/gemm.hpp"
#include "cuda/ops.hpp"
#include "parallel/device_transport.hpp"
#include "train/calibrate_kernels.hpp"
#include "train/calibrate_links.hpp"
#include "train/calibration.hpp"

namespace mpiformer::calibration {
namespace {

// The mean over every rank of a value each measured at once.
double mean_over_ranks(double v) {
  int world = 1;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return v / world;
}

// Device buffers for the links, every element 1.0f.
std::shared_ptr<float> device_ones(int64_t n) {
  const size_t count = static_cast<size_t>(std::max<int64_t>(n, 1));
  std::shared_ptr<float> p(static_cast<float*>(cuda::device_alloc(count * sizeof(float))),
                           [](float* q) { cuda::device_free(q); });
  const std::vector<float> ones(count, 1.0f);
  CUDA_CHECK(cudaMemcpy(p.get(), ones.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

// [offload] host_link_gbs: every rank at once copies 256 MiB between
// page-locked host memory and its GPU, each way on its stream (as the
// offloaded update does); the slower direction, the mean over the ranks
// (ranks sharing a GPU share its link: each gets its part).
double measure_host_link(cuda::Context& ctx, MPI_Comm node) {
  const int64_t n = int64_t{64} << 20;
  cuda::PinnedBuffer<float> host(static_cast<size_t>(n));
  cuda::DeviceBuffer<float> dev(static_cast<size_t>(n));
  std::fill(host.get(), host.get() + n, 1.0f);
  double best[2] = {0, 0};  // seconds: to the device, to the host
  for (int pass = 0; pass < 4; ++pass) {
    for (int way = 0; way < 2; ++way) {
      MPI_CHECK(MPI_Barrier(node));
      const auto t0 = std::chrono::steady_clock::now();
      CUDA_CHECK(cudaMemcpyAsync(way == 0 ? static_cast<void*>(dev.get()) : host.get(),
                                 way == 0 ? static_cast<const void*>(host.get()) : dev.get(),
                                 sizeof(float) * static_cast<size_t>(n),
                                 way == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                 ctx.stream()));
      ctx.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (pass > 0) best[way] = best[way] == 0 ? s : std::min(best[way], s);  // the first warms up
    }
  }
  return mean_over_ranks(4.0 * static_cast<double>(n) / std::max(best[0], best[1]));
}

template <class A>
void measure_compute_in(cuda::Context& ctx, const MeasuredShapes& shapes, double seconds,
                        MachineSpec& m) {
  measure_compute(OpBench<cuda::Ops<A>>{ctx, [&ctx] { ctx.synchronize(); }}, shapes, seconds, m);
}

}  // namespace

MachineSpec calibrate_gpu(const CalibrationRequest& req, MPI_Comm node, int node_rank) {
  std::string why;
  const int gpus = cuda::device_count(&why);
  if (gpus == 0) throw InputError("", "calibrate --device", "\"cuda\", but no GPU is usable (" + why + ")");
  int node_size = 1;
  MPI_CHECK(MPI_Comm_size(node, &node_size));
  const int sharing = (node_size + gpus - 1) / gpus;  // ranks on each GPU
  cuda::Context ctx(node_rank % gpus);
  MachineSpec m;
  m.name = req.name;
  m.device = Device::kCuda;
  m.precision = req.precision;
  m.devices_per_node = gpus;
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  m.memory = static_cast<double>(total);

  // Both peaks, every rank at once; MFU and the planner count against the
  // rates' precision.
  const double bf16_peak = mean_over_ranks(cuda::measure_gemm_peak(cuda::DType::BF16));
  const double fp32_peak = mean_over_ranks(cuda::measure_gemm_peak(cuda::DType::F32));
  // fp16 runs on the same tensor cores at bf16's rate: its kernels are
  // measured below, against bf16's peak.
  const bool bf16 = req.precision != Precision::kFp32;
  m.peak_flops = m.matmul_flops = m.attention_flops = bf16 ? bf16_peak : fp32_peak;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  if (rank == 0) {
    std::printf("calibrate: %s, %.1f GiB; cuBLASLt GEMM peaks bf16 %.1f, fp32 %.1f TFLOP/s per "
                "GPU; rates measured in %s\n",
                ctx.device_name().c_str(), static_cast<double>(total) / (1u << 30), bf16_peak / 1e12,
                fp32_peak / 1e12, name_of(req.precision));
    std::fflush(stdout);
  }

  const MeasuredShapes shapes = shapes_to_measure(req.models, req.batches, req.max_tp);
  if (req.precision == Precision::kFp16) {
    measure_compute_in<cuda::fp16>(ctx, shapes, req.seconds, m);
  } else if (bf16) {
    measure_compute_in<cuda::bf16>(ctx, shapes, req.seconds, m);
  } else {
    measure_compute_in<float>(ctx, shapes, req.seconds, m);
  }
  m.host_link_bandwidth = measure_host_link(ctx, node);
  LinkTransport nccl;
  nccl.connect = [&ctx](MpiCommunicator& group) { return device_transport(group, ctx.stream()); };
  nccl.allocate = device_ones;
  nccl.fence = [] { CUDA_CHECK(cudaDeviceSynchronize()); };
  measure_links(node, node_rank, shapes.max_link_bytes, req.seconds, nccl, m);

  // What a rank holds on its GPU outside our allocator, with its context,
  // cuBLASLt (kernels loaded by the GEMMs above) and a communicator alive:
  // the device's used memory, shared by the ranks on it, less what we
  // allocated. The largest over the ranks.
  {
    MPI_Comm dup;
    MPI_CHECK(MPI_Comm_dup(node, &dup));
    MpiCommunicator group(dup);
    const auto comm = device_transport(group, ctx.stream());
    ctx.synchronize();
    MPI_CHECK(MPI_Barrier(node));
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    double runtime = std::max(0.0, static_cast<double>(total - free) / sharing -
                                       static_cast<double>(cuda::device_allocated_now()));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &runtime, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    m.runtime = runtime;
  }
  return m;
}

}  // namespace mpiformer::calibration
