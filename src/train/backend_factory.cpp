#include "train/backend_factory.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "train/grad_reducer.hpp"
#include "train/zero_shards.hpp"

#include "core/error.hpp"
#include "core/format.hpp"
#include "common/op_constants.hpp"
#include "core/host_memory.hpp"
#ifdef MPIFORMER_HAVE_CUDA
#include "cuda/device.hpp"
#include "parallel/host_staged_communicator.hpp"
#endif
#ifdef MPIFORMER_HAVE_NCCL
#include "parallel/nccl_communicator.hpp"
#endif

namespace mpiformer {

BackendChoice choose_backend(const Deck& deck, NodePlace node) {
  BackendChoice c;
  c.precision = deck.train.precision;
  c.sharing = node.size;
#ifdef MPIFORMER_HAVE_CUDA
  std::string why;
  const int gpus = cuda::device_count(&why);
  if (deck.run.device == Device::kCuda || (deck.run.device == Device::kAuto && gpus > 0)) {
    if (gpus == 0) {
      throw InputError(deck.path, "[run] device",
                       "\"cuda\" needs a GPU, but none is usable on this node (" + why + ")");
    }
    c.device = Device::kCuda;
    c.gpu = node.rank % gpus;
    c.sharing = (node.size + gpus - 1) / gpus;
    return c;
  }
  c.why_cpu = "no usable GPU: " + why;
#else
  if (deck.run.device == Device::kCuda) {
    throw InputError(deck.path, "[run] device",
                     "\"cuda\", but this mpiformer was built without CUDA (cmake --preset cuda)");
  }
  c.why_cpu = "built without CUDA";
#endif
  if (deck.run.device == Device::kCpu) c.why_cpu = "[run] device = \"cpu\"";
  c.device = Device::kCpu;
  return c;
}

StageOptions stage_options(int64_t micro_batch, int slots, Recompute recompute, int zero,
                           bool sequence_parallel) {
  StageOptions o;
  o.sequence_parallel = sequence_parallel;
  o.micro_batch = micro_batch;
  o.slots = slots;
  o.recompute = recompute;
  o.external_master = zero >= 1;
  o.window_grads = zero >= 2;
  o.window_weights = zero >= 3;
  return o;
}

namespace {

// What a save's checksum gathers of one tensor on its root (checkpointing's
// gather_tensor): the whole logical tensor, and a second copy put in order
// unless the parts arrive as whole rows in order: column or head slices
// never do, row slices not when replicas also cut them (dp > 1: the parts
// come tensor rank fastest).
double save_gather_bytes(const ParameterSpec& spec, int64_t dp) {
  const bool reordered = spec.split == Split::kCols || spec.split == Split::kHeads ||
                         (spec.split == Split::kRows && dp > 1);
  return static_cast<double>(spec.logical_numel()) * 4 * (reordered ? 2 : 1);
}

}  // namespace

RankMemory rank_memory(const Deck& deck, const BackendChoice& choice, int stage_index, int slots) {
  const GptConfig& cfg = deck.model;
  // Tensor rank 0: every rank stores as much, and it holds the most real
  // vocabulary rows (what the save's gathers and ZeRO's parts follow).
  const StageRange range = partition_stage(cfg, stage_index, static_cast<int>(deck.parallel.pp),
                                           deck.parallel.tp, 0);
  const PrecisionPlan types = precision_plan(choice.precision);
  const double act = static_cast<double>(element_bytes(types.activations));
  const double acc = static_cast<double>(element_bytes(types.master));
  const int zero = static_cast<int>(deck.parallel.zero);
  RankMemory m;
  m.slots = slots;
  // What attention keeps: the GPU's fused kernels each row's statistics,
  // the host the probabilities (each op set's kAttention).
  const AttentionStorage attention = choice.device == Device::kCuda
                                         ? AttentionStorage::kRowStatistics
                                         : AttentionStorage::kProbabilities;
  m.stage = stage_footprint(cfg, range,
                            stage_options(deck.train.micro_batch, slots, deck.train.recompute, zero,
                                          deck.parallel.sequence_parallel),
                            static_cast<size_t>(act), static_cast<size_t>(acc), attention);
  if (zero == 0) {
    m.optimizer = 2 * m.stage.parameters;  // AdamW's two moments, as the master weights
    // On the host, MPI's non-blocking all-reduce keeps a temporary of its
    // bucket: kReductionsInFlight buckets at most (grad_reducer.hpp).
    if (choice.device == Device::kCpu) {
      const ParameterTable table(cfg, range);
      double largest = 0;
      if (deck.parallel.dp > 1) {
        for (const auto& [begin, end] : gradient_buckets(table, deck.parallel.bucket_mb * (1 << 20)))
          largest = std::max(largest, static_cast<double>(end - begin));
      }
      m.comm = static_cast<double>(kReductionsInFlight) * largest * acc;
      // Held one at a time, after the buckets: MPI's temporary of the tied
      // embedding's blocking all-reduce (pp > 1, its stages), and a save's
      // gather of a tensor-parallel slice for its checksum (the whole
      // tensor, then put in order; whole tensors need none at zero 0).
      if (deck.parallel.pp > 1 && (range.has_embedding || range.has_head))
        m.comm = std::max(m.comm, static_cast<double>(table.at("wte").storage) * acc);
      for (const auto& spec : table.specs())
        if (!spec.whole()) m.comm = std::max(m.comm, save_gather_bytes(spec, deck.parallel.dp));
    }
  } else {
    // The largest shard of the group (parts end at rows, so they differ a little).
    const ParameterTable table(cfg, range);
    const ShardPlan plan(table, StageLayout(table, range), static_cast<int>(deck.parallel.dp), 0);
    const double shard = static_cast<double>(plan.max_shard_size());
    // fp32 at zero 1-2: the masters are the stage's own weights (already
    // counted there); else float masters, and the 16-bit copy published.
    const bool masters_are_weights = !types.weight_copy && zero < 3;
    m.shard_master = masters_are_weights ? 0 : shard * (acc + (types.weight_copy ? act : 0));
    m.shard_gradients = shard * acc;
    m.optimizer = 2 * shard * acc;
    if (zero >= 2) m.comm = 2 * static_cast<double>(plan.max_block_part()) * acc;
    // On the host, MPI's non-blocking reduce-scatter keeps a temporary of
    // its whole input (kInFlight units at most), and a save gathers each
    // tensor whole on one rank for its checksum (checkpointing.cpp; on a
    // GPU run both are host memory, not the device's).
    if (choice.device == Device::kCpu) {
      // Units go in reverse buffer order, at most kInFlight at once: the
      // most any kInFlight consecutive ones hold. At zero >= 2 the blocks
      // go through their windows one at a time, apart from the rest.
      std::vector<double> sizes;
      double largest_block = 0;
      for (const ShardUnit& u : plan.units()) {
        const double n = static_cast<double>(u.end - u.begin);
        if (zero >= 2 && u.block >= 0) {
          largest_block = std::max(largest_block, n);
        } else {
          sizes.push_back(n);
        }
      }
      double in_flight = static_cast<double>(kInFlight) * largest_block;
      for (size_t i = 0; i < sizes.size(); ++i) {
        double sum = 0;
        for (size_t j = i; j < std::min(sizes.size(), i + kInFlight); ++j) sum += sizes[j];
        in_flight = std::max(in_flight, sum);
      }
      double gather = 0;
      for (const auto& spec : table.specs())
        gather = std::max(gather, save_gather_bytes(spec, deck.parallel.dp));
      // A save runs between steps, when no reduce-scatter is in flight:
      // the larger of the two is what is held at once.
      m.comm += std::max(in_flight * acc, gather);
    }
  }
  // The device context's workspace (cuBLASLt's, the column sums').
  if (choice.device == Device::kCuda) m.workspace = static_cast<double>(kDeviceWorkspaceBytes);
  // The host's fp16 products are widened to float (gemm_narrow.cpp): its
  // three scratch buffers grow to the largest first operand, second
  // operand and 16-bit output of any product, and stay.
  if (choice.device == Device::kCpu && choice.precision == Precision::kFp16) {
    const double BT = static_cast<double>(deck.train.micro_batch * cfg.seq_len);
    const double C = static_cast<double>(cfg.n_embd), tp = static_cast<double>(deck.parallel.tp);
    const double Cm = 4 * C / tp, Cq = 3 * C / tp;
    const double V = range.has_head ? static_cast<double>(cfg.padded_vocab(deck.parallel.tp)) / tp : 0;
    const double widest = std::max({V, Cm, Cq, C});  // an activation's row
    const double first = BT * widest;                 // activations (or their gradients)
    const double second = std::max({V * C, Cm * C, Cq * C, BT * std::max(C, Cm)});  // weights or activations
    m.workspace = 4 * (2 * first + second);
  }
  // Host 16-bit attention rounds the probabilities (in backward, the score
  // gradients) for its products into one kept buffer of [B, NH/tp, T, T]
  // (attention.hpp), and a 16-bit tensor-group sum (or sequence
  // parallelism's reduce-scatter) is widened into a kept float buffer of
  // the largest, [B, T, C] (mpi_communicator.cpp). The
  // cross-entropy's per-thread float row (V floats a thread, under 2 MB at
  // 8 threads and GPT-2's vocabulary) is left out.
  if (choice.device == Device::kCpu && element_bytes(types.activations) == 2) {
    const double B = static_cast<double>(deck.train.micro_batch);
    const double T = static_cast<double>(cfg.seq_len), tp = static_cast<double>(deck.parallel.tp);
    if (range.num_layers() > 0)
      m.workspace += 2 * B * static_cast<double>(cfg.n_head) / tp * T * T;
    if (deck.parallel.tp > 1) m.comm += 4 * B * T * static_cast<double>(cfg.n_embd);
  }
  return m;
}

namespace {

// Bytes the device can still give each rank sharing it (-1: unknown).
double available_per_rank(const BackendChoice& choice, std::string* what) {
  double bytes = -1;
#ifdef MPIFORMER_HAVE_CUDA
  if (choice.device == Device::kCuda) {
    bytes = static_cast<double>(cuda::device_free_bytes(choice.gpu));
    *what = strprintf("GPU %d has free", choice.gpu);
  }
#endif
  if (choice.device == Device::kCpu) {
    bytes = host_available_bytes();
    *what = "this node has available (MemAvailable, or the cgroup's limit)";
  }
  return bytes < 0 ? -1 : bytes / choice.sharing;
}

void check_fits(const Deck& deck, const BackendChoice& choice, int stage_index, int slots) {
  const RankMemory m = rank_memory(deck, choice, stage_index, slots);
  std::string what;
  const double avail = available_per_rank(choice, &what);
  if (avail < 0 || m.total() <= avail) return;
  const double gb = 1e9;
  throw InputError(
      deck.path, "[model], [train] micro_batch, [parallel] pp, [parallel] tp, [parallel] zero",
      strprintf("stage %d needs about %.2f GB per rank (parameters %.2f GB, gradients %.2f GB, "
                "AdamW moments %.2f GB, activations %.2f GB = %d slot(s) x %.2f GB at "
                "micro_batch %lld with recompute \"%s\", scratch and buffers %.2f GB), but %s "
                "%.2f GB per rank (%d rank(s) share it). To fit: raise [parallel] zero (now "
                "%lld; shards optimizer state, gradients and weights over dp = %lld), set [train] "
                "recompute = \"full\", raise [parallel] pp (now %lld) or tp (now %lld), lower "
                "[train] micro_batch, or train a smaller model",
                stage_index, m.total() / gb, m.parameters() / gb, m.gradients() / gb,
                m.optimizer / gb, m.stage.activations / gb, slots, m.stage.per_slot / gb,
                static_cast<long long>(deck.train.micro_batch), name_of(deck.train.recompute),
                (m.stage.scratch + m.comm + m.workspace) / gb, what.c_str(), avail / gb,
                choice.sharing, static_cast<long long>(deck.parallel.zero),
                static_cast<long long>(deck.parallel.dp), static_cast<long long>(deck.parallel.pp),
                static_cast<long long>(deck.parallel.tp)));
}

}  // namespace

std::unique_ptr<StageBackend> make_stage_backend(const Deck& deck, const BackendChoice& choice,
                                                 const GptConfig& cfg, const GridPlace& place,
                                                 int slots) {
  const int stage_index = place.stage;
  check_fits(deck, choice, stage_index, slots);
  const TrainConfig& tc = deck.train;
  const StageRange range = partition_stage(cfg, stage_index, static_cast<int>(deck.parallel.pp),
                                           deck.parallel.tp, place.tp_rank);
  StageSetup setup;
  setup.options = stage_options(tc.micro_batch, slots, tc.recompute,
                                static_cast<int>(deck.parallel.zero),
                                deck.parallel.sequence_parallel);
  setup.adam = AdamWSettings{tc.beta1, tc.beta2, tc.eps, tc.weight_decay};
  setup.zero = static_cast<int>(deck.parallel.zero);
  setup.dp = static_cast<int>(deck.parallel.dp);
  setup.dp_rank = place.dp_rank;
  setup.precision = choice.precision;
  if (choice.device == Device::kCpu) return make_host_backend(cfg, range, setup);
#ifdef MPIFORMER_HAVE_CUDA
  if (cfg.head_dim() > 128) {
    throw InputError(deck.path, "[model] n_embd, [model] n_head",
                     strprintf("head size %lld (n_embd / n_head): the GPU's fused attention takes "
                               "head sizes up to 128",
                               static_cast<long long>(cfg.head_dim())));
  }
  try {
    return make_cuda_backend(cfg, range, setup, choice.gpu);
  } catch (const SystemError& e) {
    if (std::string(e.what()).find("out of memory") == std::string::npos) throw;
    throw InputError(deck.path, "[train] micro_batch",
                     strprintf("stage %d does not fit in GPU memory with micro_batch %lld and "
                               "%d activation slot(s): lower micro_batch or raise pp (%s)",
                               stage_index, static_cast<long long>(tc.micro_batch), slots,
                               e.what()));
  }
#else
  throw std::logic_error("make_stage_backend: a GPU back end in a build without CUDA");
#endif
}

void check_memory_spaces(const StageComms& c, bool stage_on_device) {
  const MemorySpace want = stage_on_device ? MemorySpace::kDevice : MemorySpace::kHost;
  const std::pair<const char*, const Communicator*> groups[] = {
      {"activations", c.pipe_act}, {"gradients", c.pipe_grad}, {"data-parallel", c.dp},
      {"tensor-parallel", c.tp},   {"tied embedding", c.tied}};
  for (const auto& [what, comm] : groups) {
    if (comm != nullptr && comm->buffers() != want) {
      throw std::logic_error(strprintf(
          "connect_stage: the %s group (%d rank(s)) was given a communicator of %s memory for a "
          "stage whose buffers are in %s memory",
          what, comm->size(), comm->buffers() == MemorySpace::kHost ? "host" : "device",
          stage_on_device ? "device" : "host"));
    }
  }
}

StageComms connect_stage(ProcessGrid& g, StageBackend& stage) {
  StageComms c;
  c.pipe_act = c.pipe_grad = &g.pipeline();
  c.dp = &g.data_parallel();
  c.tp = &g.tensor_parallel();
  c.tied = g.tied_embedding();
  if (!stage.on_device()) {
    check_memory_spaces(c, false);
    stage.connect_tensor_parallel(*c.tp);
    return c;
  }
#ifdef MPIFORMER_HAVE_CUDA
  void* stream = stage.device_stream();
  // Every rank builds its groups in the same order (tensor, data-parallel,
  // then the two pipeline directions, then the tied pair), so the collective
  // initialisations cannot wait on each other.
  auto transport = [&](MpiCommunicator& group, const char* what) -> Communicator* {
    c.description += c.description.empty() ? "" : ", ";
#ifdef MPIFORMER_HAVE_NCCL
    if (!group_shares_a_gpu(group)) {
      c.owned.push_back(std::make_unique<NcclCommunicator>(group, stream));
      c.description += strprintf("%s: NCCL (%d rank%s)", what, group.size(),
                                 group.size() == 1 ? "" : "s");
      return c.owned.back().get();
    }
    const char* why = "ranks share a GPU";
#else
    const char* why = "built without NCCL";
#endif
    c.owned.push_back(std::make_unique<HostStagedCommunicator>(group, stream));
    c.description += strprintf("%s: MPI through host memory (%d rank%s; %s)", what, group.size(),
                               group.size() == 1 ? "" : "s", why);
    return c.owned.back().get();
  };
  // A group of one rank carries no message, but its collectives still
  // read and write the stage's buffers (ZeRO's reduce-scatter and gather
  // at dp = 1 copy a shard in and out): they need a device communicator
  // too, ordered on the stream. One serves every one-rank group (each is
  // the rank alone), created with the first one met.
  Communicator* alone = nullptr;
  auto device_comm = [&](MpiCommunicator& group, const char* what) -> Communicator* {
    if (group.size() > 1) return transport(group, what);
    if (alone == nullptr) alone = transport(group, "one-rank groups");
    return alone;
  };
  c.tp = device_comm(g.tensor_parallel(), "tensor-parallel");
  c.dp = device_comm(g.data_parallel(), "data-parallel");
  c.pipe_act = device_comm(g.pipeline(), "activations");
  c.pipe_grad = device_comm(g.pipeline(), "gradients");
  if (MpiCommunicator* tied = g.tied_embedding()) c.tied = device_comm(*tied, "tied embedding");
  check_memory_spaces(c, true);
  stage.connect_tensor_parallel(*c.tp);
  // While the stage waits for its GPU, a communicator that failed (a peer
  // gone) ends the wait with an exception instead of a hang.
  std::vector<Communicator*> watched;
  for (const auto& o : c.owned) watched.push_back(o.get());
  stage.set_wait_check([watched] {
    for (Communicator* comm : watched) comm->check_health();
  });
#endif
  return c;
}

}  // namespace mpiformer
