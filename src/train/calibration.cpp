#include "train/calibration.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <thread>
#include <cmath>
#include <malloc.h>
#include <unistd.h>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/host_memory.hpp"
#include "core/mpi_check.hpp"
#include "checkpoint.hpp"
#include "host/ops.hpp"
#include "model/stage_work.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train/backend_factory.hpp"
#include "train/data_feeder.hpp"
#include "train/memory_report.hpp"
#include "train/step_prediction.hpp"

namespace mpiformer {
namespace {

using Ops = host::Ops<float>;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call of `f`: every rank of `comm` starts together, warms up
// once, times one call, then all make the same number of calls (a
// collective's ranks must) filling about `budget`; the ranks' mean (they
// run at once, as a step's ranks do).
template <class F>
double seconds_per_call(MPI_Comm comm, double budget, F&& f) {
  MPI_CHECK(MPI_Barrier(comm));
  f();
  double t0 = now();
  f();
  double once = now() - t0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, comm));
  const int reps = static_cast<int>(std::clamp(budget / std::max(once, 1e-9), 1.0, 2000.0));
  MPI_CHECK(MPI_Barrier(comm));
  t0 = now();
  for (int i = 0; i < reps; ++i) f();
  double t = (now() - t0) / reps;
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_SUM, comm));
  return t / size;
}

// How many copies of a kernel's buffers to cycle through so that each
// call starts from data outside the core's private cache, as a step's ops
// do (each reads what others wrote, and weights unused since the last
// micro-batch): at least four times the L2 cache over all copies.
int copies(double bytes) {
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l2 <= 0) l2 = 2 << 20;
  return static_cast<int>(std::clamp(std::ceil(4.0 * static_cast<double>(l2) / bytes), 1.0, 16.0));
}

std::vector<float> values(double n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 13) - 0.06f;
  return v;
}

MatmulPoint measure_matmul(int64_t m, int64_t k, int64_t n, double budget) {
  struct Set {
    std::vector<float> inp, w, bias, out, dinp, dw, db, dout;
  };
  const int K = copies(4.0 * static_cast<double>(2 * m * k + 2 * n * k + 2 * m * n));
  std::vector<Set> sets;
  for (int i = 0; i < K; ++i)
    sets.push_back({values(m * k), values(n * k), values(n), values(m * n), values(m * k),
                    values(n * k), values(n), values(m * n)});
  int next = 0;
  MatmulPoint p{m, k, n, 0, 0};
  p.forward = seconds_per_call(MPI_COMM_WORLD, budget, [&] {
    Set& x = sets[next++ % K];
    host::matmul_forward(x.out.data(), x.inp.data(), x.w.data(), x.bias.data(), m, k, n);
  });
  p.backward = seconds_per_call(MPI_COMM_WORLD, budget, [&] {
    Set& x = sets[next++ % K];
    host::matmul_backward(x.dinp.data(), x.dw.data(), x.db.data(), x.dout.data(), x.inp.data(),
                          x.w.data(), m, k, n);
  });
  return p;
}

AttentionPoint measure_attention(int64_t hs, int64_t T, double budget) {
  const int64_t pairs = 8, C = pairs * hs;
  struct Set {
    std::vector<float> qkv, out, att, dqkv, datt, dout;
  };
  const int K = copies(4.0 * static_cast<double>(8 * T * C + 2 * pairs * T * T));
  std::vector<Set> sets;
  for (int i = 0; i < K; ++i)
    sets.push_back({values(T * 3 * C), values(T * C), values(pairs * T * T), values(T * 3 * C),
                    values(pairs * T * T), values(T * C)});
  int next = 0;
  AttentionPoint p{hs, T, 0, 0};
  p.forward = seconds_per_call(MPI_COMM_WORLD, budget, [&] {
    Set& x = sets[next++ % K];
    host::attention_forward(x.out.data(), x.att.data(), x.qkv.data(), 1, T, C, pairs);
  }) / pairs;
  p.backward = seconds_per_call(MPI_COMM_WORLD, budget, [&] {
    Set& x = sets[next++ % K];
    host::attention_backward(x.dqkv.data(), x.datt.data(), x.dout.data(), x.qkv.data(),
                             x.att.data(), 1, T, C, pairs);
  }) / pairs;
  return p;
}

// Each non-GEMM kernel over about `elements`, as bytes/s by the same byte
// count stage_work prices it with (kernel_arrays), each call on buffers
// another call touched last (copies()).
KernelRow measure_kernels(double elements, const GptConfig& cfg, double budget) {
  const int64_t C = cfg.n_embd, T = cfg.seq_len, Vp = cfg.padded_vocab();
  const int64_t N = std::max<int64_t>(1, static_cast<int64_t>(elements) / C);
  const double e = static_cast<double>(N * C);
  KernelRow row;
  row.elements = e;
  const int K = copies(4.0 * 4 * e);
  struct Set {
    std::vector<float> x, y, z, m, v;
  };
  std::vector<Set> sets;
  for (int i = 0; i < K; ++i) sets.push_back({values(e), values(e), values(e), values(e), values(e)});
  for (Set& s : sets)
    for (float& x : s.v) x = std::abs(x);
  int next = 0;
  auto rate = [&](Kernel k, bool bwd, double count, auto&& f) {
    row.bandwidth[kernel_rate_name(k, bwd)] =
        count * kernel_arrays(k, bwd) * sizeof(float) /
        seconds_per_call(MPI_COMM_WORLD, budget, [&] { f(sets[next++ % K]); });
  };
  auto w = values(C), b = values(C), mean = values(N), rstd = values(N), dw = values(C), db = values(C);
  rate(Kernel::kLayernorm, false, e, [&](Set& s) {
    host::layernorm_forward(s.y.data(), mean.data(), rstd.data(), s.x.data(), w.data(), b.data(), N, C);
  });
  rate(Kernel::kLayernorm, true, e, [&](Set& s) {
    host::layernorm_backward(s.z.data(), dw.data(), db.data(), s.y.data(), s.x.data(), w.data(),
                             mean.data(), rstd.data(), N, C);
  });
  rate(Kernel::kGelu, false, e, [&](Set& s) { host::gelu_forward(s.y.data(), s.x.data(), N * C); });
  rate(Kernel::kGelu, true, e, [&](Set& s) { host::gelu_backward(s.z.data(), s.x.data(), s.y.data(), N * C); });
  rate(Kernel::kResidual, false, e, [&](Set& s) { host::residual_forward(s.z.data(), s.x.data(), s.y.data(), N * C); });
  // Embedding: rows of positions within one sequence, tokens spread over
  // the vocabulary.
  const int64_t B = std::max<int64_t>(1, N / T), Tn = std::min(N, T);
  std::vector<int32_t> tokens(static_cast<size_t>(B * Tn));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % cfg.vocab_size);
  auto wte = values(Vp * C), wpe = values(T * C);
  const double be = static_cast<double>(B * Tn * C);
  rate(Kernel::kEmbedding, false, be, [&](Set& s) {
    host::embedding_forward(s.y.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, C, 0, Vp);
  });
  rate(Kernel::kEmbedding, true, be, [&](Set& s) {
    host::embedding_backward(wte.data(), wpe.data(), s.y.data(), tokens.data(), B, Tn, C, 0, Vp);
  });
  // Cross-entropy over rows of the padded vocabulary, as many elements.
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(e) / Vp);
  auto losses = values(rows);
  std::vector<int32_t> targets(static_cast<size_t>(rows), 1);
  rate(Kernel::kCrossentropy, false, static_cast<double>(rows * Vp), [&](Set& s) {
    host::crossentropy_forward_backward(losses.data(), s.z.data(), targets.data(), rows,
                                        cfg.vocab_size, Vp, 1e-3f);
  });
  // AdamW: 7 arrays of fp32 per element (p, g, m, v read; p, m, v written).
  std::vector<AdamWChunk> chunks;
  append_adamw_chunks(chunks, 0, N * C, true);
  const AdamWParams ap{1e-4, 0.9, 0.95, 1e-8, 0.1, 1, 1.0};
  row.bandwidth["adamw"] = e * 7 * sizeof(float) / seconds_per_call(MPI_COMM_WORLD, budget, [&] {
    Set& s = sets[next++ % K];
    host::adamw_update_chunks(s.x.data(), s.y.data(), s.m.data(), s.v.data(), chunks.data(),
                              static_cast<int64_t>(chunks.size()), ap);
  });
  return row;
}

// Least squares of t = a + b x over the points; the ring model's latency
// per step is a / steps, its bandwidth 1 / b.
LinkCost fit(const std::vector<std::pair<double, double>>& xt, double steps) {
  double sx = 0, st = 0, sxx = 0, sxt = 0;
  const double n = static_cast<double>(xt.size());
  for (const auto& [x, t] : xt) sx += x, st += t, sxx += x * x, sxt += x * t;
  const double b = (n * sxt - sx * st) / (n * sxx - sx * sx);
  const double a = (st - b * sx) / n;
  LinkCost c;
  c.latency = std::max(0.0, a / steps);
  c.bandwidth = b > 0 ? 1.0 / b : 1e15;
  return c;
}

// The four collectives over `comm`, at sizes up to `max_bytes`.
Link measure_link(MPI_Comm raw, double max_bytes, double budget) {
  MPI_Comm dup;
  MPI_CHECK(MPI_Comm_dup(raw, &dup));
  MpiCommunicator comm(dup);
  const int g = comm.size();
  std::vector<double> sizes;
  for (double s = 4096; s <= max_bytes; s *= 8) sizes.push_back(s);
  std::vector<std::pair<double, double>> ar, rs, ag, sr;
  const double part = static_cast<double>(g - 1) / g;
  for (double bytes : sizes) {
    const int64_t n = static_cast<int64_t>(bytes / 4) / g * g;
    std::vector<float> buf(static_cast<size_t>(n), 1.0f), recv(static_cast<size_t>(n / g));
    const std::vector<int64_t> counts(static_cast<size_t>(g), n / g);
    ar.push_back({2 * part * 4 * n, seconds_per_call(dup, budget, [&] { comm.allreduce_sum(buf.data(), n); })});
    rs.push_back({part * 4 * n, seconds_per_call(dup, budget, [&] {
                    comm.start_reduce_scatter_sum(buf.data(), recv.data(), counts)->wait();
                  })});
    ag.push_back({part * 4 * n, seconds_per_call(dup, budget, [&] {
                    comm.start_allgather(buf.data() + comm.rank() * (n / g), buf.data(), counts, 4)->wait();
                  })});
    // Ping-pong between the first two ranks: half the round trip.
    const double rtt = seconds_per_call(dup, budget, [&] {
      const size_t b = static_cast<size_t>(4 * n);
      if (comm.rank() == 0) {
        comm.start_send_bytes(buf.data(), b, 1, 7)->wait();
        comm.recv_bytes(buf.data(), b, 1, 8);
      } else if (comm.rank() == 1) {
        comm.recv_bytes(buf.data(), b, 0, 7);
        comm.start_send_bytes(buf.data(), b, 0, 8)->wait();
      }
    });
    // The ranks' mean counts the g - 2 idle ones as zero: ranks 0 and 1's
    // round trip is mean x g / 2, one way half of that.
    sr.push_back({4.0 * n, rtt * g / 2 / 2});
  }
  Link l;
  l.allreduce = fit(ar, 2.0 * (g - 1));
  l.reduce_scatter = fit(rs, g - 1.0);
  l.allgather = fit(ag, g - 1.0);
  l.sendrecv = fit(sr, 1);
  return l;
}

// The high-water mark of this process's resident memory, reset to what
// it holds now (Linux: /proc/self/clear_refs 5), and read (VmHWM), so a
// probe's peak is its own and not an earlier probe's.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  return static_cast<bool>(f.flush());
}
double peak_bytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  double kb = 0;
  while (f >> key) {
    if (key == "VmHWM:") {
      f >> kb;
      return kb * 1024;
    }
  }
  return resident_bytes();
}

// What a checkpoint save holds beyond the stage (parallel HDF5's and
// MPI-IO's buffers), from a real collective write of `bytes` of floats
// into `path` (removed after): the most any rank's peak rose.
double save_overhead(const std::string& path, double bytes) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  const int64_t cols = 1024, rows = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4) / cols);
  std::vector<float> data(rank == 0 ? static_cast<size_t>(rows * cols) : 0, 0.5f);
  DatasetSlice slice;
  slice.name = "/model/calibration_probe";
  slice.shape = {rows, cols};
  if (rank == 0) {
    slice.boxes = {DatasetBox{0, rows, 0, cols}};
    slice.data = data.data();
    slice.reports_checksum = true;
    slice.checksum = tensor_checksum(data.data(), rows * cols);
  }
  malloc_trim(0);
  const bool reset = reset_peak();
  const double before = resident_bytes();
  CheckpointMeta meta;
  meta.run_id = "calibration";
  write_checkpoint(MPI_COMM_WORLD, path, meta, {slice});
  double extra = reset ? std::max(0.0, peak_bytes() - before) : 0.0;
  if (rank == 0) std::remove(path.c_str());
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &extra, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return extra;
}

// A real stage (the model's blocks with the embedding and the head) run
// forward and backward: its time against the sum of its
// kernels timed alone, and what this process holds beyond the stage's
// accounting once it has run (the BLAS library's buffers, the allocator's
// slack): the machine file's [[compute.stage]] rows and runtime_mb.
struct StageProbe {
  GptConfig cfg;  // as probed (the model's blocks, as many as fit)
  int64_t micro_batch = 0;
  Recompute recompute = Recompute::kNone;
  double seconds = 0, overhead = 0;
};
StageProbe probe_stage(const GptConfig& model, int64_t micro_batch, Recompute recompute,
                       double baseline, double budget) {
  // As many blocks as the model has (the factor grows with the stage's
  // depth: more activations, further from the caches), up to what a
  // quarter of this rank's share of the node's memory holds.
  GptConfig cfg = model;
  Deck d;
  d.train.micro_batch = micro_batch;
  d.train.global_batch = micro_batch;
  d.train.recompute = recompute;
  BackendChoice cpu;
  int world = 1;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const double budget_bytes = 0.25 * host_available_bytes() / world;
  for (cfg.n_layer = model.n_layer; cfg.n_layer > 1; --cfg.n_layer) {
    d.model = cfg;
    if (rank_memory(d, cpu, 0, 1).total() <= budget_bytes) break;
  }
  const StageRange range{0, cfg.n_layer, true, true};
  malloc_trim(0);  // what earlier probes freed goes back first: not this stage's
  reset_peak();
  StageSetup setup;
  setup.options = stage_options(micro_batch, 1, recompute, 0);
  auto stage = make_host_backend(cfg, range, setup);
  MPI_Comm self;
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_SELF, &self));
  MpiCommunicator tp(self);
  stage->connect_tensor_parallel(tp);
  stage->init_parameters(1);
  const int64_t BT = micro_batch * cfg.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(BT));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % cfg.vocab_size);
  const double measured = seconds_per_call(MPI_COMM_WORLD, budget, [&] {
    stage->forward(0, tokens.data(), tokens.data(), true, 1.0f / static_cast<float>(BT));
    stage->backward(0, nullptr);
  });
  stage->take_loss_sum();
  d.model = cfg;
  const double accounted = rank_memory(d, cpu, 0, 1).total();
  // The run's figure is its peak growth over its baseline.
  double overhead = std::max(0.0, peak_bytes() - baseline - accounted);
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &overhead, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return {cfg, micro_batch, recompute, measured, overhead};
}

}  // namespace

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
  std::vector<StageProbe> probes;
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
    std::set<int64_t> mbs = {req.micro_batches[i]};
    for (int64_t b = 1; b <= std::min<int64_t>(req.batches[i], 64); b *= 4) mbs.insert(b);
    // Full recomputation's backward runs each block's forward again on
    // buffers it just used: measured apart (attention's is like none's).
    for (Recompute rc : {Recompute::kNone, Recompute::kFull}) {
      for (int64_t mb : mbs) {
        probes.push_back(probe_stage(req.models[i], mb, rc, baseline, 4 * req.seconds));
        probes.back().overhead += data;
      }
    }
  }

  MachineSpec m;
  m.name = req.name;
  m.device = Device::kCpu;
  const int threads = std::max(1, host::blas_threads());
  m.devices_per_node = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / threads);
  m.memory = host_available_bytes() / m.devices_per_node;
  // The practical peak, every rank at once (what MFU is counted against).
  double peak = host::measure_gemm_peak();
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  m.peak_flops = m.matmul_flops = peak / world;
  m.attention_flops = m.matmul_flops;

  // The shapes of each model's stage ops, for every tensor-parallel width
  // and rows from one sequence to the global batch (a matmul of at most
  // ~4 GFLOP: beyond, the rate is flat and the nearest row stands).
  std::set<std::tuple<int64_t, int64_t, int64_t>> matmuls;
  std::set<std::pair<int64_t, int64_t>> attention;
  std::vector<std::pair<double, const GptConfig*>> streams;
  double max_bytes = 64e6;
  for (size_t i = 0; i < req.models.size(); ++i) {
    const GptConfig& cfg = req.models[i];
    const int64_t C = cfg.n_embd, T = cfg.seq_len;
    for (int64_t tp = 1; tp <= req.max_tp; tp *= 2) {
      if (cfg.n_head % tp != 0) continue;
      const int64_t ca = C / tp, cm = 4 * C / tp, vl = cfg.padded_vocab(tp) / tp;
      const std::pair<int64_t, int64_t> kn[] = {{C, 3 * ca}, {ca, C}, {C, cm}, {cm, C}, {C, vl}};
      for (const auto& [k, n] : kn) {
        for (int64_t rows = T; rows <= T * req.batches[i]; rows *= 4) {
          if (rows > T && 2.0 * rows * k * n > 4e9) break;
          matmuls.insert({rows, k, n});
        }
      }
    }
    attention.insert({cfg.head_dim(), T});
    // From one sequence's [T, C] to the MLP's [B, T, 4C] of a large micro-batch.
    for (int64_t b = 1; b <= 4 * std::min<int64_t>(req.batches[i], 64); b *= 4) {
      const double e = static_cast<double>(b * T * C);
      if (e <= 32e6) streams.push_back({e, &cfg});
    }
    StageRange all{0, cfg.n_layer, true, true};
    max_bytes = std::max(max_bytes, std::min(256e6, 4.0 * static_cast<double>(ParameterTable(cfg, all).total_storage())));
  }
  for (const auto& [rows, k, n] : matmuls) m.matmul.push_back(measure_matmul(rows, k, n, req.seconds));
  for (const auto& [hs, T] : attention) m.attention.push_back(measure_attention(hs, T, req.seconds));
  for (const auto& [e, cfg] : streams) m.kernels.push_back(measure_kernels(e, *cfg, req.seconds));
  std::sort(m.kernels.begin(), m.kernels.end(),
            [](const KernelRow& a, const KernelRow& b) { return a.elements < b.elements; });
  m.memory_bandwidth = m.kernels.empty() ? 10e9 : m.kernels.back().bandwidth.at("residual");
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

  m.intra = measure_link(node, max_bytes, req.seconds);
  // Between nodes: one rank of each (node-local rank 0).
  MPI_Comm leaders;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, node_comm.rank() == 0 ? 0 : MPI_UNDEFINED, rank, &leaders));
  int nodes = 0;
  if (leaders != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_size(leaders, &nodes));
  MPI_CHECK(MPI_Bcast(&nodes, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (nodes > 1) {
    Link inter;
    if (leaders != MPI_COMM_NULL) inter = measure_link(leaders, max_bytes, req.seconds);
    double v[8] = {inter.allreduce.latency, inter.allreduce.bandwidth,
                   inter.reduce_scatter.latency, inter.reduce_scatter.bandwidth,
                   inter.allgather.latency, inter.allgather.bandwidth,
                   inter.sendrecv.latency, inter.sendrecv.bandwidth};
    MPI_CHECK(MPI_Bcast(v, 8, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    m.inter = {{v[0], v[1]}, {v[2], v[3]}, {v[4], v[5]}, {v[6], v[7]}};
    m.has_inter = true;
  }
  if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
  return m;
}

}  // namespace mpiformer
