#include "train/backend_factory.hpp"

#include "core/error.hpp"
#include "core/format.hpp"
#ifdef MPIFORMER_HAVE_CUDA
#include "cuda/device.hpp"
#include "parallel/host_staged_communicator.hpp"
#endif
#ifdef MPIFORMER_HAVE_NCCL
#include "parallel/nccl_communicator.hpp"
#endif

namespace mpiformer {

BackendChoice choose_backend(const Deck& deck, int local_rank) {
  BackendChoice c;
  c.precision = deck.train.precision;
#ifdef MPIFORMER_HAVE_CUDA
  std::string why;
  const int gpus = cuda::device_count(&why);
  if (deck.run.device == Device::kCuda || (deck.run.device == Device::kAuto && gpus > 0)) {
    if (gpus == 0) {
      throw InputError(deck.path, "[run] device",
                       "\"cuda\" needs a GPU, but none is usable on this node (" + why + ")");
    }
    c.device = Device::kCuda;
    c.gpu = local_rank % gpus;
    return c;
  }
  c.why_cpu = "no usable GPU: " + why;
#else
  (void)local_rank;
  if (deck.run.device == Device::kCuda) {
    throw InputError(deck.path, "[run] device",
                     "\"cuda\", but this mpiformer was built without CUDA (cmake --preset cuda)");
  }
  c.why_cpu = "built without CUDA";
#endif
  if (deck.run.device == Device::kCpu) c.why_cpu = "[run] device = \"cpu\"";
  if (c.precision == Precision::kBf16) {
    throw InputError(deck.path, "[train] precision",
                     "\"bf16\" runs on the GPU back end only; this run is on the CPU (" +
                         c.why_cpu + ")");
  }
  c.device = Device::kCpu;
  return c;
}

std::unique_ptr<StageBackend> make_stage_backend(const Deck& deck, const BackendChoice& choice,
                                                 const GptConfig& cfg, int stage_index,
                                                 int slots) {
  const TrainConfig& tc = deck.train;
  const StageRange range = partition_stage(cfg, stage_index, static_cast<int>(deck.parallel.pp));
  const AdamWSettings adam{tc.beta1, tc.beta2, tc.eps, tc.weight_decay};
  if (choice.device == Device::kCpu) {
    return make_host_backend(cfg, range, tc.micro_batch, slots, adam);
  }
#ifdef MPIFORMER_HAVE_CUDA
  try {
    return make_cuda_backend(cfg, range, tc.micro_batch, slots, adam, choice.gpu,
                             choice.precision == Precision::kBf16);
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

StageComms connect_stage(ProcessGrid& g, StageBackend& stage) {
  StageComms c;
  c.pipe_act = c.pipe_grad = &g.pipeline();
  c.dp = &g.data_parallel();
  c.tied = g.tied_embedding();
  if (!stage.on_device()) return c;
#ifdef MPIFORMER_HAVE_CUDA
  void* stream = stage.device_stream();
  // Every rank builds its groups in the same order (data-parallel, then the
  // two pipeline directions, then the tied pair), so the collective
  // initialisations cannot wait on each other. Groups of one rank never
  // carry a message and keep the MPI communicator.
  auto device_comm = [&](MpiCommunicator& group, const char* what) -> Communicator* {
    if (group.size() == 1) return &group;
    c.description += c.description.empty() ? "" : ", ";
#ifdef MPIFORMER_HAVE_NCCL
    if (!group_shares_a_gpu(group)) {
      c.owned.push_back(std::make_unique<NcclCommunicator>(group, stream));
      c.description += strprintf("%s: NCCL (%d ranks)", what, group.size());
      return c.owned.back().get();
    }
    const char* why = "ranks share a GPU";
#else
    const char* why = "built without NCCL";
#endif
    c.owned.push_back(std::make_unique<HostStagedCommunicator>(group, stream));
    c.description +=
        strprintf("%s: MPI through host memory (%d ranks; %s)", what, group.size(), why);
    return c.owned.back().get();
  };
  c.dp = device_comm(g.data_parallel(), "data-parallel");
  c.pipe_act = device_comm(g.pipeline(), "activations");
  c.pipe_grad = device_comm(g.pipeline(), "gradients");
  if (MpiCommunicator* tied = g.tied_embedding()) c.tied = device_comm(*tied, "tied embedding");
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
