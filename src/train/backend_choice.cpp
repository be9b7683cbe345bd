// Which back end this rank runs: [run] device resolved against the build
// and the node, [train] precision checked against the result.
#include "core/error.hpp"
#include "train/stage_backend.hpp"
#ifdef MPIFORMER_HAVE_CUDA
#include "cuda/device.hpp"
#endif

namespace mpiformer {

BackendChoice choose_backend(const Deck& deck, int local_rank) {
  BackendChoice c;
  c.precision = deck.train.precision;
#ifdef MPIFORMER_HAVE_CUDA
  std::string why;
  const int gpus = cuda::device_count(&why);
  if (deck.run.device == "cuda" || (deck.run.device == "auto" && gpus > 0)) {
    if (gpus == 0) {
      throw InputError(deck.path, "[run] device",
                       "\"cuda\" needs a GPU, but none is usable on this node (" + why + ")");
    }
    c.device = "cuda";
    c.gpu = local_rank % gpus;
    return c;
  }
  c.why_cpu = "no usable GPU: " + why;
#else
  (void)local_rank;
  if (deck.run.device == "cuda") {
    throw InputError(deck.path, "[run] device",
                     "\"cuda\", but this mpiformer was built without CUDA (cmake --preset cuda)");
  }
  c.why_cpu = "built without CUDA";
#endif
  if (deck.run.device == "cpu") c.why_cpu = "[run] device = \"cpu\"";
  if (c.precision == "bf16") {
    throw InputError(deck.path, "[train] precision",
                     "\"bf16\" runs on the GPU back end only; this run is on the CPU (" +
                         c.why_cpu + ")");
  }
  c.device = "cpu";
  return c;
}

}  // namespace mpiformer
