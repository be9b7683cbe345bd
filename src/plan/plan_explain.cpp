#include "plan/plan_explain.hpp"

#include <algorithm>
#include <string>

#include "core/format.hpp"
#include "core/precision_plan.hpp"
#include "model/parameter_table.hpp"
#include "model/stage_layout.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "plan/memory_report.hpp"
#include "plan/rank_memory.hpp"

namespace mpiformer {

std::vector<double> state_bytes_per_parameter(const Deck& deck, Device device) {
  BackendChoice choice;
  choice.device = device;
  choice.precision = deck.train.precision;
  std::vector<double> out;
  for (int zero = 0; zero <= 3; ++zero) {
    Deck d = deck;
    d.parallel.zero = zero;
    double most = 0;
    for (int s = 0; s < static_cast<int>(d.parallel.pp); ++s) {
      // Model state does not depend on the slots: one will do.
      const RankMemory m = rank_memory(d, choice, s, SlotKinds::any(1));
      const double n = static_cast<double>(
          ParameterTable(d.model, stage_range_of(d, s, 0)).total_storage());
      if (n > 0) most = std::max(most, (m.parameters() + m.gradients() + m.optimizer) / n);
    }
    out.push_back(most);
  }
  return out;
}

std::vector<std::string> explain_lines(const Deck& deck, const MachineSpec& machine,
                                       const Prediction& p) {
  std::vector<std::string> lines;
  const std::vector<double> bytes = state_bytes_per_parameter(deck, machine.device);
  std::string line = "model state of #1's fullest stage, device bytes per parameter (weights + "
                     "gradients + AdamW):";
  for (size_t z = 0; z < bytes.size(); ++z)
    line += strprintf("%s zero %zu %.2f%s", z ? "," : "", z, bytes[z],
                      static_cast<int64_t>(z) == deck.parallel.zero ? " (this layout's)" : "");
  const double dp = static_cast<double>(deck.replicas());
  if (precision_plan(deck.train.precision).weight_copy) {
    line += strprintf("; Megatron-LM's distributed optimizer: 6 + 12/dp = %.2f", 6 + 12 / dp);
    // The other [train] grad_dtype (16-bit gradients need zero >= 1).
    Deck other = deck;
    const bool grad16 = deck.train.grad_dtype == GradDtype::kBf16;
    other.train.grad_dtype = grad16 ? GradDtype::kFp32 : GradDtype::kBf16;
    const std::vector<double> b = state_bytes_per_parameter(other, machine.device);
    line += strprintf("; with grad_dtype = \"%s\": zero 1 %.2f, zero 2 %.2f, zero 3 %.2f",
                      name_of(other.train.grad_dtype), b[1], b[2], b[3]);
  }
  lines.push_back(line);
  // What zero 3 keeps whole beside its shard (FSDP's root unit and its
  // prefetch): the tensors outside the windows, and two blocks' windows,
  // each as weights (16-bit, or fp32) and float gradients; the fullest
  // stage. The vocabulary goes through the windows, in pieces where it is
  // larger than one (StageLayout::windows_vocab, piece).
  const PrecisionPlan types = precision_plan(deck.train.precision);
  double outside = 0, windows = 0, vocab_whole = 0;
  bool vocab_windowed = false;
  int64_t pieces = 1;
  for (int s = 0; s < static_cast<int>(deck.parallel.pp); ++s) {
    const StageRange range = stage_range_of(deck, s, 0);
    const ParameterTable table(deck.model, range);
    const StageLayout layout(table, range);
    const bool vocab = layout.windows_vocab(true);
    const double out = static_cast<double>(layout.resident_offset(table.total_storage(), true, vocab));
    const double w = range.num_layers() > 0 ? 2 * static_cast<double>(layout.block_storage()) : 0;
    vocab_windowed = vocab_windowed || vocab;
    if (vocab)
      for (const int64_t use : {StageLayout::kVocabIn, StageLayout::kVocabOut})
        if (layout.vocab(use).begin >= 0) pieces = std::max(pieces, layout.vocab_pieces(use));
    if (out + w > outside + windows) {
      outside = out;
      windows = w;
      vocab_whole = vocab ? 0
                          : static_cast<double>(layout.resident_offset(table.total_storage(), true) -
                                                layout.resident_offset(table.total_storage(), true, true));
    }
  }
  const double each = static_cast<double>(element_bytes(types.activations) + element_bytes(types.master));
  std::string vocab_said = !vocab_windowed ? "no vocabulary on it"
                           : pieces == 1
                               ? "the vocabulary goes through the windows, as a block does"
                               : strprintf("the vocabulary goes through the windows, as a block "
                                           "does, in up to %lld pieces of a window each",
                                           static_cast<long long>(pieces));
  if (vocab_whole > 0)
    vocab_said = strprintf("the vocabulary's tensors among them, larger than a window: %.2f GiB of "
                           "weights and gradients",
                           vocab_whole * each / (1 << 30));
  lines.push_back(strprintf(
      "zero 3 keeps whole beside its shard: the tensors outside the windows (%.1f M parameters: %.2f "
      "GiB of weights and gradients; %s) and two blocks' windows (%.1f M: %.2f GiB)",
      outside / 1e6, outside * each / (1 << 30), vocab_said.c_str(), windows / 1e6,
      windows * each / (1 << 30)));

  if (deck.checkpoint.async) {
    BackendChoice choice;
    choice.device = machine.device;
    choice.precision = deck.train.precision;
    double most = 0;
    for (int s = 0; s < static_cast<int>(deck.parallel.pp); ++s)
      most = std::max(most, rank_memory(deck, choice, s, SlotKinds::any(1)).checkpoint_snapshot);
    lines.push_back(strprintf(
        "[checkpoint] async: the saves' snapshot holds up to %.2f GiB of host memory a rank from the "
        "first save on (%s)",
        most / (1 << 30),
        machine.device == Device::kCpu ? "in the memory above" : "beside the device's, not in it"));
  }

  // The step time's main terms, then what nothing measured.
  lines.push_back(strprintf(
      "step time of #1: %.2f ms = compute %.2f (of which tensor collectives %.2f, expert "
      "all-to-alls %.2f, context ring %.2f) + exposed data-parallel communication %.2f + bubble "
      "%.2f + optimizer %.2f",
      1e3 * p.step.step_time, 1e3 * p.compute, 1e3 * p.tp_comm, 1e3 * p.ep_comm, 1e3 * p.cp_comm,
      1e3 * p.exposed_comm, 1e3 * p.bubble, 1e3 * p.optimizer));
  std::vector<std::string> assumed;
  if (machine.matmul.empty() && machine.matmul_tiles.empty())
    assumed.push_back("every GEMM at the flat matmul_tflops of the machine file, whatever its "
                      "shape (no measured shapes: `mpiformer calibrate` on the machine measures them)");
  else if (machine.matmul.empty())
    assumed.push_back("GEMMs by shape from the machine file's tiles and waves, the smaller tiles' "
                      "rates as the file states them (no measured shapes: `mpiformer calibrate` on "
                      "the machine measures them)");
  if (machine.attention.empty())
    assumed.push_back("attention at the flat attention_tflops (no measured shapes)");
  if (machine.stages.empty())
    assumed.push_back("no glue between kernels (no measured stage factor: 1.0)");
  if (deck.parallel.schedule == ScheduleKind::kZbH1)
    assumed.push_back("zb-h1's W pass at the same efficiency as the B pass it is split from");
  if (machine.device == Device::kCuda && deck.replicas() > 1)
    assumed.push_back(deck.parallel.zero >= 2
                          ? "each block's reduce-scatter on its own stream beside the passes that "
                            "follow (forwards too) until its gradient window is needed again, the "
                            "passes not slowed by NCCL sharing the GPU (the overlap is not "
                            "measured)"
                      : deck.train.grad_compression == GradCompression::kNone
                          ? "each block's reduction on its own stream beside the rest of the last "
                            "micro-batch's backward, the passes not slowed by NCCL sharing the "
                            "GPU (the overlap is not measured)"
                          : "the data-parallel reduction hidden behind backward up to backward's "
                            "length (the overlap is not measured)");
  if (machine.device == Device::kCuda && deck.replicas() > 1 && deck.parallel.zero >= 1)
    assumed.push_back("the weights' all-gather after AdamW beside the next step's first forward, "
                      "each block waiting only for its own (the overlap is not measured)");
  if (deck.train.grad_compression != GradCompression::kNone && deck.replicas() > 1)
    assumed.push_back("the compressed all-reduce's kernels at the elementwise kernels' bandwidth, "
                      "and its all-to-all at the link's all-to-all rate");
  if (deck.parallel.pp > 1)
    assumed.push_back("pipeline sends at the link's idle send-receive rate, not slowed by the "
                      "data-parallel traffic sharing it");
  if (deck.parallel.cp > 1 && machine.device == Device::kCuda)
    assumed.push_back(std::string("the context ring's sends hidden behind each pass's attention up "
                                  "to its length, and its blocks priced at the fused kernel's rates (the "
                                  "GPU's ring has not been measured") +
                      (deck.train.precision == Precision::kFp32
                           ? ": in fp32 its kernels are float FMAs, well below them)"
                           : ": its 16-bit tiles are the fused kernel's scheme)"));
  if (deck.parallel.cp > 1 && machine.device == Device::kCpu)
    assumed.push_back("the context ring's blocks priced at the attention rows' rates for their "
                      "size (the ring's own blockwise kernel is not calibrated)");
  if (deck.parallel.tp > 1 && machine.device == Device::kCuda)
    assumed.push_back("tensor collectives never hidden behind the GEMMs (errs slow)");
  if (assumed.empty()) {
    lines.push_back("assumed, not measured: nothing listed");
  } else {
    lines.push_back("assumed, not measured:");
    for (const std::string& a : assumed) lines.push_back("  - " + a);
  }
  return lines;
}

}  // namespace mpiformer
