// The bytes a GptStage allocates, by category, from the shapes alone: the
// answer to "will it fit" before anything is allocated. Exact for the
// stage's own buffers (tests/unit/test_stage_footprint.cpp checks it
// against what the stage allocates, for several shapes and splits); the
// device's context adds its scratch on top (see the trainer's estimate).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/attention_storage.hpp"
#include "core/gpt_config.hpp"
#include "model/parameter_table.hpp"
#include "model/stage_layout.hpp"
#include "model/stage_options.hpp"

namespace mpiformer {

struct StageFootprint {
  double parameters = 0;   // master weights (Acc), unless external_master
  double gradients = 0;    // Acc: whole, or outside the blocks + 2 windows
  double weight_copy = 0;  // the Act weights where they are not the master:
                           // whole, or outside the blocks + 2 windows
  double per_slot = 0;     // activations of one in-flight micro-batch of a whole chunk
  double activations = 0;  // every slot's: per_slot each, less where a slot holds a short
                           // chunk only (core/slot_kinds.hpp)
  double scratch = 0;      // backward scratch shared by the slots, inbox, loss
  double total() const { return parameters + gradients + weight_copy + activations + scratch; }
};

// Doubles: a deck's shapes may overflow any integer count (that is what
// this is for). act_bytes/acc_bytes: sizeof(Act), sizeof(Acc); `attention`:
// what the op set's attention keeps (Ops::kAttention: the host keeps the
// probabilities, in Act; the GPU each row's statistics, in Acc).
StageFootprint stage_footprint(const GptConfig& cfg, const StageRange& range,
                               const StageOptions& options, size_t act_bytes, size_t acc_bytes,
                               AttentionStorage attention = AttentionStorage::kProbabilities);
// The same, with the stage's parameter table and layout (of cfg, range)
// at hand (the planner keeps them).
StageFootprint stage_footprint(const GptConfig& cfg, const StageRange& range,
                               const ParameterTable& table, const StageLayout& layout,
                               const StageOptions& options, size_t act_bytes, size_t acc_bytes,
                               AttentionStorage attention);
inline StageFootprint stage_footprint(const GptConfig& cfg, const StageRange& range,
                                      int64_t micro_batch, int slots, size_t act_bytes,
                                      size_t acc_bytes,
                                      AttentionStorage attention = AttentionStorage::kProbabilities) {
  return stage_footprint(cfg, range, StageOptions{micro_batch, SlotKinds::any(slots)}, act_bytes,
                         acc_bytes, attention);
}

}  // namespace mpiformer
