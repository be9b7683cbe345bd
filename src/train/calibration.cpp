#include "train/calibration.hpp"

#include <mpi.h>

#include <malloc.h>

#include <algorithm>
#include <set>
#include <thread>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/host_memory.hpp"
#include "core/mpi_check.hpp"
#include "host/ops.hpp"
#include "model/model_flops.hpp"
#include "model/parameter_table.hpp"
#include "parallel/mpi_communicator.hpp"
#include "plan/memory_report.hpp"
#include "plan/step_prediction.hpp"
#include "train/calibrate_kernels.hpp"
#include "train/calibrate_links.hpp"
#include "train/calibrate_memory.hpp"
#include "train/calibrate_progress.hpp"
#include "train/data_feeder.hpp"

namespace mpiformer {

namespace calibration {

MeasuredShapes shapes_to_measure(const std::vector<GptConfig>& models,
                                 const std::vector<int64_t>& batches, int max_tp) {
  MeasuredShapes s;
  for (size_t i = 0; i < models.size(); ++i) {
    const GptConfig& cfg = models[i];
    const int64_t C = cfg.n_embd, T = cfg.seq_len;
    for (int64_t tp = 1; tp <= max_tp; tp *= 2) {
      if (cfg.n_head % tp != 0) continue;
      const int64_t ca = C / tp, cm = 4 * C / tp, vl = cfg.padded_vocab(tp) / tp;
      const std::pair<int64_t, int64_t> kn[] = {{C, 3 * ca}, {ca, C}, {C, cm}, {cm, C}, {C, vl}};
      for (const auto& [k, n] : kn) {
        for (int64_t rows = T; rows <= T * batches[i]; rows *= 4) {
          if (rows > T && 2.0 * rows * k * n > 4e9) break;
          s.matmuls.insert({rows, k, n});
        }
      }
    }
    s.attention.insert({cfg.head_dim(), T});
    for (int64_t b = 1; b <= 4 * std::min<int64_t>(batches[i], 64); b *= 4) {
      const double e = static_cast<double>(b * T * C);
      if (e <= 32e6) s.streams.push_back({e, &cfg});
    }
    const StageRange all{0, cfg.n_layer, true, true};
    s.max_link_bytes = std::max(
        s.max_link_bytes,
        std::min(256e6, 4.0 * static_cast<double>(ParameterTable(cfg, all).total_storage())));
  }
  return s;
}

void measure_links(MPI_Comm node, int node_rank, double max_bytes, double seconds,
                   const LinkTransport& transport, MachineSpec& m) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  m.intra = measure_link(node, max_bytes, seconds, transport);
  // Between nodes: one rank of each (node-local rank 0).
  MPI_Comm leaders;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, node_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders));
  int nodes = 0;
  if (leaders != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_size(leaders, &nodes));
  MPI_CHECK(MPI_Bcast(&nodes, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (nodes > 1) {
    Link inter;
    if (leaders != MPI_COMM_NULL) inter = measure_link(leaders, max_bytes, seconds, transport);
    double v[10] = {inter.allreduce.latency, inter.allreduce.bandwidth,
                    inter.reduce_scatter.latency, inter.reduce_scatter.bandwidth,
                    inter.allgather.latency, inter.allgather.bandwidth,
                    inter.sendrecv.latency, inter.sendrecv.bandwidth,
                    inter.alltoall.latency, inter.alltoall.bandwidth};
    MPI_CHECK(MPI_Bcast(v, 10, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    m.inter = {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, {v[6], v[7]}, {v[8], v[9]}};
    m.has_inter = true;
  }
  if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
}

}  // namespace calibration

using namespace calibration;

MachineSpec calibrate_machine(const CalibrationRequest& req) {
  const double baseline = resident_bytes();
  int world = 1, rank = 0;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MpiCommunicator node_comm(node);
  // Every rank decides alike (a node of one rank among larger ones must
  // not leave the others waiting in a collective).
  int smallest_node = node_comm.size();
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &smallest_node, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (smallest_node < 2) {
    throw InputError("", "calibrate",
                     "the links between ranks are measured from ranks on one node: launch at "
                     "least 2 per node (mpirun -np 2 mpiformer calibrate ...)");
  }
#ifdef MPIFORMER_HAVE_CUDA
  if (req.device == Device::kCuda) return calibrate_gpu(req, node, node_comm.rank());
#else
  if (req.device == Device::kCuda) {
    throw InputError("", "calibrate --device", "\"cuda\", but this mpiformer was built without CUDA");
  }
#endif
  // The threads a run of this many ranks per node would take (the BLAS,
  // oneDNN and the loops together): what the rates are measured with, and
  // what sets the devices per node below.
  host::set_compute_threads(host::choose_compute_threads(0, node_comm.size()));
  // Real stages first, smallest model first: what a process holds beyond
  // a stage's accounting (the BLAS library's buffers grow with the largest
  // matmul it has run) is measured before larger shapes have run. Each at
  // micro-batches from 1 to its batch (the stage outgrows the caches as
  // they grow) and at its deck's.
  std::vector<size_t> order(req.models.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return req.models[a].n_embd * req.models[a].seq_len < req.models[b].n_embd * req.models[b].seq_len;
  });
  // The probes to run: each model at micro-batches 1, 4, 16, ... up to its
  // batch (at most 64) and --probe-tokens tokens, and at its deck's own.
  struct Planned {
    size_t model;
    int64_t micro_batch;
    Recompute recompute;
  };
  std::vector<Planned> planned;
  for (size_t i : order) {
    std::set<int64_t> mbs = {req.micro_batches[i]};
    const int64_t T = req.models[i].seq_len;
    for (int64_t b = 1; b <= std::min<int64_t>(req.batches[i], 64) &&
                        static_cast<double>(b * T) <= req.probe_tokens;
         b *= 4)
      mbs.insert(b);
    // Full recomputation's backward runs each block's forward again on
    // buffers it just used: measured apart (attention's is like none's).
    for (Recompute rc : {Recompute::kNone, Recompute::kFull})
      for (int64_t mb : mbs) planned.push_back({i, mb, rc});
  }
  // A probe's cost: its training FLOPs (full recomputation a third more).
  auto cost = [&](const Planned& p) {
    return training_flops_per_token(req.models[p.model]) *
           static_cast<double>(p.micro_batch * req.models[p.model].seq_len) *
           (p.recompute == Recompute::kFull ? 4.0 / 3 : 1.0);
  };
  auto name = [&](const Planned& p) {
    const GptConfig& c = req.models[p.model];
    return strprintf("%lld x %lld, seq %lld, micro-batch %lld, recompute %s",
                     static_cast<long long>(c.n_layer), static_cast<long long>(c.n_embd),
                     static_cast<long long>(c.seq_len), static_cast<long long>(p.micro_batch),
                     name_of(p.recompute));
  };
  double work = 0;
  for (const Planned& p : planned) work += cost(p);
  Progress progress(rank, {"whole stages", "GEMM peak", "kernels", "links"});
  progress.begin(0, static_cast<int>(planned.size()), work);
  std::vector<StageProbe> probes;
  size_t next = 0;  // in `planned`, which runs in model order
  for (size_t i : order) {
    // The deck's data reader as the run opens it: its buffers (the sample
    // order, the reader's caches) are this model's; what the library keeps
    // after it is closed, everyone's.
    double data = 0;
    if (i < req.decks.size()) {
      try {
        malloc_trim(0);
        const double before = resident_bytes();
        GptConfig cfg = req.models[i];
        auto feeder = std::make_unique<DataFeeder>(req.decks[i], cfg);
        feeder->plan(1, 1, 0);
        feeder->load_train(0, 0);
        const double open = resident_bytes();
        feeder.reset();
        malloc_trim(0);
        data = std::max(0.0, open - std::max(before, resident_bytes()));
      } catch (const InputError&) {
        // No data here (a deck for another machine): nothing to measure.
      }
    }
    for (; next < planned.size() && planned[next].model == i; ++next) {
      const Planned& p = planned[next];
      probes.push_back(probe_stage(req.models[i], p.micro_batch, p.recompute, baseline, 4 * req.seconds));
      probes.back().overhead += data;
      progress.point(cost(p), next + 1 < planned.size() ? name(planned[next + 1]) : "");
    }
  }

  MachineSpec m;
  m.name = req.name;
  m.device = Device::kCpu;
  m.precision = req.precision;
  const int threads = std::max(1, host::blas_threads());
  m.devices_per_node = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / threads);
  m.memory = host_available_bytes() / m.devices_per_node;
  // The practical peak, every rank at once (what MFU is counted against).
  progress.begin(1, 0);
  const Element act = precision_plan(req.precision).activations;
  double peak = act == Element::kF32 ? host::measure_gemm_peak() : host::measure_narrow_gemm_peak(act);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  m.peak_flops = m.matmul_flops = peak / world;
  m.attention_flops = m.matmul_flops;

  const MeasuredShapes shapes = shapes_to_measure(req.models, req.batches, req.max_tp);
  progress.begin(2, points(shapes));
  host::Context ctx;
  // The rates of the precision's own kernels (oneDNN's matmuls, fp16
  // widened to the fp32 path).
  switch (req.precision) {
    case Precision::kBf16:
      measure_compute(OpBench<host::Ops<host::Bf16>>{ctx, [] {}}, shapes, req.seconds, m, &progress);
      break;
    case Precision::kFp16:
      measure_compute(OpBench<host::Ops<host::Fp16>>{ctx, [] {}}, shapes, req.seconds, m, &progress);
      break;
    case Precision::kFp32:
      measure_compute(OpBench<host::Ops<float>>{ctx, [] {}}, shapes, req.seconds, m, &progress);
      break;
  }
  // A save's buffers come on top of every stage's.
  if (!req.scratch.empty()) {
    const double save = save_overhead(req.scratch, 16e6);
    for (StageProbe& p : probes) p.overhead += save;
  }
  // The stages' factors, now that their kernels are measured.
  for (const StageProbe& p : probes) {
    const auto [f, b] = kernel_seconds(m, p.cfg, StageRange{0, p.cfg.n_layer, true, true},
                                       p.micro_batch, p.recompute, 4);
    m.stages.push_back({p.cfg.n_embd, p.cfg.seq_len, p.micro_batch, p.cfg.n_layer, p.recompute,
                        p.seconds / (f + b), p.overhead});
    m.runtime = std::max(m.runtime, p.overhead);
  }

  progress.begin(3, 0);
  measure_links(node, node_comm.rank(), shapes.max_link_bytes, req.seconds, LinkTransport{}, m);
  if (rank == 0) std::fprintf(stderr, "calibrate: measured in %.0f s\n", progress.elapsed());
  return m;
}

}  // namespace mpiformer
