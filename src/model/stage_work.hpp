// What one micro-batch of a stage computes, op by op, from the shapes
// alone: the planner prices it with a machine's rates (the matmul table,
// the attention rows, the non-GEMM kernels' bandwidths, the tensor
// group's all-reduces). Mirrors GptStage's forward and backward
// (gpt_stage_impl.hpp) call by call, as stage_footprint mirrors its
// constructor; tests/unit/test_stage_work.cpp holds it to the FLOP count
// of model_flops (an independent formula) and the tensor all-reduces to
// Megatron's count.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/gpt_config.hpp"
#include "core/settings.hpp"
#include "model/parameter_table.hpp"

namespace mpiformer {

// The kernels a stage calls, as a machine file names their rates.
enum class Kernel {
  kMatmul,     // Ops::matmul_forward / matmul_backward: m rows, k in, n out
  kAttention,  // Ops::attention_*: m = batch x heads, k = head size, n = sequence
  kLayernorm,
  kGelu,
  kResidual,   // residual adds, copies, fills
  kCrossentropy,
  kEmbedding,
};
inline constexpr int kKernelCount = 7;
const char* kernel_name(Kernel k);

// The arrays of `elements` an elementwise kernel reads and writes (its
// bytes, with the element size): how stage_work counts a kernel's traffic
// and how calibrate turns a timing into a bandwidth, so the two agree.
int kernel_arrays(Kernel k, bool backward);
// The machine file's name for a kernel's rate: "gelu", "gelu_backward", ...
std::string kernel_rate_name(Kernel k, bool backward);

struct WorkItem {
  Kernel kernel;
  bool backward = false;      // the kernel's backward (matmul: dinp and dW)
  int64_t m = 0, k = 0, n = 0;  // the GEMM-like kernels' shape
  double elements = 0;        // the others: elements, and the bytes read and written
  double bytes = 0;           // (matmul: the least its operands move)
  double flops = 0;           // useful FLOPs (matmul, attention: as MFU counts them)
  // Attention: blocks whose queries see every key (a context ring's
  // blocks off the diagonal), where a causal kernel would skip the half
  // above it.
  bool unmasked = false;
};

// One of the tensor group's collectives: an all-reduce of `bytes`, or
// (sequence parallelism) a reduce-scatter or all-gather whose whole buffer
// is `bytes`.
struct TensorCollective {
  enum Kind { kAllreduce, kAllgather, kReduceScatter } kind = kAllreduce;
  double bytes = 0;
};

struct StageWork {
  std::vector<WorkItem> forward, backward;  // backward: with what recomputation runs again
  // Split backward (zero-bubble schedules): `backward` is B, the input
  // gradient, and `weights` is W, the weight gradients (empty otherwise).
  std::vector<WorkItem> weights;
  // The tensor group's collectives (in compute order; blocking).
  std::vector<TensorCollective> tp_forward, tp_backward, tp_weights;
  // Expert parallelism: each all-to-all's bytes this rank holds of it
  // (its tokens' rows out, or the same back), in compute order.
  std::vector<double> ep_forward, ep_backward;
  // Context parallelism: each ring pass's messages this rank sends to the
  // next, in compute order: key/value blocks (cp_block_bytes each) and,
  // backward, their gradients' sums (cp_sums_bytes each, in float).
  struct RingPass {
    double blocks = 0, sums = 0;
  };
  std::vector<RingPass> cp_forward, cp_backward;
  double cp_block_bytes = 0, cp_sums_bytes = 0;
  double ring_bytes(const RingPass& p) const { return p.blocks * cp_block_bytes + p.sums * cp_sums_bytes; }
  double message_bytes = 0;  // one activation (or its gradient) between stages
  // Where the blocks' items are in each list (forward, backward, weights):
  // [begin, end). Before them the forward's embedding and the backward's
  // head (or the received gradient's copy); after them the forward's head
  // and the backward's (or W's) embedding.
  size_t blocks_begin[3] = {0, 0, 0}, blocks_end[3] = {0, 0, 0};
};

// `sequence_parallel`, `split_backward`, `cp`: StageOptions' (the rows held are
// a tp-th; backward is B and W; a cp-th of each sequence's tokens). `expert_imbalance` (>= 1): under expert
// parallelism, the rows this rank's experts take over their fair share
// (the busiest rank of the group paces every exchange; bounded by what a
// rank can be sent, moe_plan's received rows).
StageWork stage_work(const GptConfig& cfg, const StageRange& range, int64_t micro_batch,
                     Recompute recompute, double act_bytes, bool sequence_parallel = false,
                     bool split_backward = false, double expert_imbalance = 1.0,
                     int64_t cp = 1);

}  // namespace mpiformer
