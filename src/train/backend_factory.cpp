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
#include "parallel/device_transport.hpp"
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

void check_fits(const Deck& deck, const BackendChoice& choice, int stage_index,
                const SlotKinds& slots) {
  const RankMemory m = rank_memory(deck, choice, stage_index, slots);
  std::string what;
  const double avail = available_per_rank(choice, &what);
  if (avail < 0 || m.total() <= avail) return;
  const double gb = 1e9;
  throw InputError(
      deck.path, "[model], [train] micro_batch, [parallel] pp, [parallel] tp, [parallel] zero",
      strprintf("stage %d needs about %.2f GB per rank (parameters %.2f GB, gradients %.2f GB, "
                "AdamW moments %.2f GB, activations %.2f GB in %d slot(s) of up to %.2f GB at "
                "micro_batch %lld with recompute \"%s\", scratch and buffers %.2f GB), but %s "
                "%.2f GB per rank (%d rank(s) share it). To fit: raise [parallel] zero (now "
                "%lld; shards optimizer state, gradients and weights over dp = %lld), set [train] "
                "recompute = \"full\", raise [parallel] pp (now %lld) or tp (now %lld), lower "
                "[train] micro_batch, or train a smaller model",
                stage_index, m.total() / gb, m.parameters() / gb, m.gradients() / gb,
                m.optimizer / gb, m.stage.activations / gb, slots.count, m.stage.per_slot / gb,
                static_cast<long long>(deck.train.micro_batch), name_of(deck.train.recompute),
                (m.stage.scratch + m.comm + m.workspace) / gb, what.c_str(), avail / gb,
                choice.sharing, static_cast<long long>(deck.parallel.zero),
                static_cast<long long>(deck.parallel.dp), static_cast<long long>(deck.parallel.pp),
                static_cast<long long>(deck.parallel.tp)));
}

}  // namespace

std::unique_ptr<StageBackend> make_stage_backend(const Deck& deck, const BackendChoice& choice,
                                                 const GptConfig& cfg, const GridPlace& place,
                                                 const SlotKinds& slots) {
  const int stage_index = place.stage;
  check_fits(deck, choice, stage_index, slots);
  const TrainConfig& tc = deck.train;
  const StageRange range =
      stage_range_of(deck, stage_index, place.tp_rank, place.dp_rank % deck.parallel.ep);
  StageSetup setup;
  setup.options = stage_options_of(deck, slots);
  setup.adam = AdamWSettings{tc.beta1, tc.beta2, tc.eps, tc.weight_decay};
  setup.zero = static_cast<int>(deck.parallel.zero);
  setup.dp = static_cast<int>(deck.replicas());
  setup.dp_rank = place.dp_rank;
  setup.grad_send_buffers = stage_grad_send_buffers(deck, stage_index);
  setup.grad_compression = tc.grad_compression;
  setup.grad_dtype = tc.grad_dtype;
  setup.bucket_bytes = deck.parallel.bucket_mb * (1 << 20);
  setup.precision = choice.precision;
  setup.offload = OffloadSetup{tc.offload, tc.offload_dir,
                               grid_rank(place, static_cast<int>(deck.replicas()),
                                         static_cast<int>(deck.parallel.tp)),
                               choice.sharing};
  setup.offload.block_elements = offload_block_elements(tc);
  setup.offload.world = static_cast<int>(deck.ranks());
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
                               stage_index, static_cast<long long>(tc.micro_batch), slots.count,
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
      {"tensor-parallel", c.tp},   {"tied embedding", c.tied},  {"kv heads", c.kv},
      {"expert-parallel", c.ep},   {"experts' data-parallel", c.expert_dp},
      {"context-parallel", c.cp}};
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

StageComms connect_stage(ProcessGrid& g, StageBackend& stage, ContextChunks order) {
  StageComms c;
  c.pipe_act = c.pipe_grad = &g.pipeline();
  c.dp = &g.data_parallel();
  c.tp = &g.tensor_parallel();
  c.tied = g.tied_embedding();
  c.kv = g.kv_heads();
  if (g.ep() > 1) {
    c.ep = &g.expert_parallel();
    c.expert_dp = &g.expert_data_parallel();
  }
  if (g.cp() > 1) c.cp = &g.context_parallel();
  if (!stage.on_device()) {
    check_memory_spaces(c, false);
    stage.connect_tensor_parallel(*c.tp);
    if (c.cp != nullptr) stage.connect_context_parallel(*c.cp, order);
    if (c.ep != nullptr) stage.connect_expert_parallel(g.expert_parallel(), *c.ep);
    return c;
  }
#ifdef MPIFORMER_HAVE_CUDA
  void* stream = stage.device_stream();
  // Every rank builds its groups in the same order (tensor, data-parallel,
  // then the two pipeline directions, then the kv heads' sharers, then the
  // tied pair, the context group, the expert groups), so the collective
  // initialisations cannot wait on each other.
  // A group of one rank carries no message, but its collectives still read
  // and write the stage's buffers (ZeRO's reduce-scatter and gather at dp =
  // 1 copy a shard in and out): a local communicator does that on the
  // stream, without NCCL. One serves every one-rank group (each is the rank
  // alone).
  Communicator* alone = nullptr;
  auto device_comm = [&](MpiCommunicator& group, const char* what) -> Communicator* {
    if (group.size() == 1 && alone != nullptr) return alone;
    std::string how;
    c.owned.push_back(device_transport(group, stream, &how));
    c.description += strprintf("%s%s: %s (%d rank%s)", c.description.empty() ? "" : ", ",
                               group.size() == 1 ? "one-rank groups" : what, how.c_str(),
                               group.size(), group.size() == 1 ? "" : "s");
    if (group.size() == 1) alone = c.owned.back().get();
    return c.owned.back().get();
  };
  c.tp = device_comm(g.tensor_parallel(), "tensor-parallel");
  c.dp = device_comm(g.data_parallel(), "data-parallel");
  c.pipe_act = device_comm(g.pipeline(), "activations");
  c.pipe_grad = device_comm(g.pipeline(), "gradients");
  if (MpiCommunicator* kv = g.kv_heads()) c.kv = device_comm(*kv, "kv heads");
  if (MpiCommunicator* tied = g.tied_embedding()) c.tied = device_comm(*tied, "tied embedding");
  if (g.cp() > 1) c.cp = device_comm(g.context_parallel(), "context-parallel");
  if (g.ep() > 1) {
    c.ep = device_comm(g.expert_parallel(), "expert-parallel");
    c.expert_dp = device_comm(g.expert_data_parallel(), "experts' data-parallel");
  }
  check_memory_spaces(c, true);
  stage.connect_tensor_parallel(*c.tp);
  if (c.cp != nullptr) stage.connect_context_parallel(*c.cp, order);
  if (c.ep != nullptr) stage.connect_expert_parallel(g.expert_parallel(), *c.ep);
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
