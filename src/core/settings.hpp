// The settings that pick among alternatives, as enums with their names:
// parsed once at the edge (the input deck) and compared as enums
// everywhere else. Each name table is the one list of accepted spellings.
#pragma once
#include <cstddef>
#include <string>

#include "core/gpt_config.hpp"

namespace mpiformer {

// [run] device.
enum class Device { kAuto, kCpu, kCuda };
// [train] precision: what each tensor is stored in is the precision plan
// (core/precision_plan.hpp); fp16 adds loss scaling ([train] loss_scale).
enum class Precision { kFp32, kBf16, kFp16 };
// [parallel] schedule (parallel/pipeline_schedule.hpp says what each does).
enum class ScheduleKind { kOneFOneB, kGPipe, kZbH1, kInterleaved };
// Whether a schedule splits each backward into its input-gradient half (B)
// and its weight-gradient half (W), run as separate actions.
inline bool splits_backward(ScheduleKind kind) { return kind == ScheduleKind::kZbH1; }
// [train] nonfinite: what a non-finite loss or gradient norm does.
enum class NonfinitePolicy { kStop, kSkip };
// [checkpoint] resume: the newest usable checkpoint, none, or one path.
enum class ResumeMode { kAuto, kNever, kPath };
// [train] recompute: what backward recomputes instead of keeping from the
// forward: nothing, each block's attention probabilities (the T x T part),
// or each whole block from its input.
enum class Recompute { kNone, kAttention, kFull };
// [train] offload: where the optimizer state (AdamW's moments, and the
// master weights where they are not the weights the matmuls read) lives:
// beside the weights, in host memory (a GPU run's), or in files under
// [train] offload_dir, streamed through each step (train/adamw_state.hpp).
enum class Offload { kNone, kHost, kNvme };
// [train] grad_compression: what the data-parallel reduction sends of each
// gradient (train/compressed_allreduce.hpp): float, bf16, or int8 with a
// scale per block, the part not sent kept and added back the next step.
enum class GradCompression { kNone, kBf16, kInt8 };
// [train] grad_dtype: the element type of the gradients accumulated over
// micro-batches and reduced over the data-parallel group (Megatron's
// --accumulate-allreduce-grads-in-fp32 is fp32). bf16 keeps the blocks'
// sums in 16 bits and reduces them in 16 bits on the wire; each
// micro-batch's backward still computes a block's gradients in float, and
// the master update reads float (train/zero_shards.hpp).
enum class GradDtype { kFp32, kBf16 };
// [run] health_check: the probe of each rank's GEMM rate and link at the
// start (train/health_check.hpp): on more than one node, always, never.
enum class HealthCheck { kAuto, kOn, kOff };
// [run] health_action: what a rank below the fraction of the median does.
enum class HealthAction { kWarn, kStop };
// [checkpoint] read_back: a synchronous save's read-back check while
// training waits, or on a thread beside it (latest moves once it passes).
enum class ReadBack { kInline, kBackground };
// Which chunks of a sequence a context rank holds ([parallel] cp_chunks):
// one from the front and one from the back (balanced under the causal
// mask), or two neighbours (the plain split, for comparison).
enum class ContextChunks { kHeadTail, kContiguous };

template <class E>
struct SettingName {
  E value;
  const char* name;
};

inline constexpr SettingName<Device> kDeviceNames[] = {
    {Device::kAuto, "auto"}, {Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}};
inline constexpr SettingName<Precision> kPrecisionNames[] = {
    {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}, {Precision::kFp16, "fp16"}};
inline constexpr SettingName<NonfinitePolicy> kNonfiniteNames[] = {
    {NonfinitePolicy::kStop, "stop"}, {NonfinitePolicy::kSkip, "skip"}};
inline constexpr SettingName<Recompute> kRecomputeNames[] = {
    {Recompute::kNone, "none"}, {Recompute::kAttention, "attention"}, {Recompute::kFull, "full"}};
inline constexpr SettingName<Offload> kOffloadNames[] = {
    {Offload::kNone, "none"}, {Offload::kHost, "host"}, {Offload::kNvme, "nvme"}};
inline constexpr SettingName<GradDtype> kGradDtypeNames[] = {{GradDtype::kFp32, "fp32"},
                                                             {GradDtype::kBf16, "bf16"}};
inline constexpr SettingName<GradCompression> kGradCompressionNames[] = {
    {GradCompression::kNone, "none"}, {GradCompression::kBf16, "bf16"},
    {GradCompression::kInt8, "int8"}};
inline constexpr SettingName<HealthCheck> kHealthCheckNames[] = {
    {HealthCheck::kAuto, "auto"}, {HealthCheck::kOn, "on"}, {HealthCheck::kOff, "off"}};
inline constexpr SettingName<HealthAction> kHealthActionNames[] = {
    {HealthAction::kWarn, "warn"}, {HealthAction::kStop, "stop"}};
inline constexpr SettingName<ReadBack> kReadBackNames[] = {
    {ReadBack::kInline, "inline"}, {ReadBack::kBackground, "background"}};
inline constexpr SettingName<ContextChunks> kContextChunksNames[] = {
    {ContextChunks::kHeadTail, "head_tail"}, {ContextChunks::kContiguous, "contiguous"}};
inline constexpr SettingName<ScheduleKind> kScheduleNames[] = {
    {ScheduleKind::kOneFOneB, "1f1b"}, {ScheduleKind::kGPipe, "gpipe"}, {ScheduleKind::kZbH1, "zb-h1"},
    {ScheduleKind::kInterleaved, "interleaved"}};

inline constexpr SettingName<ModelFamily> kFamilyNames[] = {
    {ModelFamily::kGpt2, "gpt2"}, {ModelFamily::kLlama, "llama"}};

template <class E, size_t N>
const char* setting_name(const SettingName<E> (&names)[N], E value) {
  for (const auto& n : names)
    if (n.value == value) return n.name;
  return "?";
}
// False when `text` is none of the names.
template <class E, size_t N>
bool parse_setting(const SettingName<E> (&names)[N], const std::string& text, E* value) {
  for (const auto& n : names) {
    if (text == n.name) {
      *value = n.value;
      return true;
    }
  }
  return false;
}
// "\"a\", \"b\" or \"c\"", for error messages.
template <class E, size_t N>
std::string setting_choices(const SettingName<E> (&names)[N]) {
  std::string s;
  for (size_t i = 0; i < N; ++i)
    s += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + ("\"" + std::string(names[i].name) + "\"");
  return s;
}

inline const char* name_of(Device d) { return setting_name(kDeviceNames, d); }
inline const char* name_of(Precision p) { return setting_name(kPrecisionNames, p); }
inline const char* name_of(ScheduleKind s) { return setting_name(kScheduleNames, s); }
inline const char* name_of(NonfinitePolicy p) { return setting_name(kNonfiniteNames, p); }
inline const char* name_of(Recompute r) { return setting_name(kRecomputeNames, r); }
inline const char* name_of(Offload o) { return setting_name(kOffloadNames, o); }
inline const char* name_of(GradCompression c) { return setting_name(kGradCompressionNames, c); }
inline const char* name_of(GradDtype g) { return setting_name(kGradDtypeNames, g); }
inline const char* name_of(HealthCheck h) { return setting_name(kHealthCheckNames, h); }
inline const char* name_of(HealthAction a) { return setting_name(kHealthActionNames, a); }
inline const char* name_of(ReadBack r) { return setting_name(kReadBackNames, r); }
inline const char* name_of(ContextChunks c) { return setting_name(kContextChunksNames, c); }
inline const char* name_of(ModelFamily f) { return setting_name(kFamilyNames, f); }

}  // namespace mpiformer
