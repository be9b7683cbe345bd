// How a pipeline stage holds its memory: the micro-batch shape and slots it
// plans activations for, what backward recomputes, and which parameter
// buffers live outside it or in windows (ZeRO). The stage's constructor and
// stage_footprint both read it, so the prediction follows every choice.
#pragma once
#include <cstdint>

#include "core/settings.hpp"
#include "core/slot_kinds.hpp"

namespace mpiformer {

struct StageOptions {
  int64_t micro_batch = 1;
  // Micro-batches in flight at once, and which chunks each slot holds
  // (the schedule's: pipeline_schedule.hpp's slot_kinds).
  SlotKinds slots;
  Recompute recompute = Recompute::kNone;
  // ZeRO >= 1, or masters offloaded ([train] offload in mixed precision):
  // the Acc master weights live in the optimizer's shard or its offloaded
  // state, not in the stage; the stage keeps only the weights its matmuls
  // read (Act).
  bool external_master = false;
  // ZeRO >= 2: the blocks' gradients live in two block-sized windows the
  // trainer drains after each block's backward (the embeddings' and final
  // LayerNorm's stay whole: the tied wte is final only at the end).
  bool window_grads = false;
  // ZeRO >= 2, or zero 1's 16-bit gradients: the vocabulary's gradients
  // (wte's, an untied head's) go through the gradient windows too, piece
  // by piece where larger than one (StageLayout::windows_vocab), so
  // nothing of them stays whole in float.
  bool window_vocab_grads = false;
  // ZeRO 3: the blocks' weights live in two windows the trainer fills
  // before each block's forward and backward (the next one ahead).
  bool window_weights = false;
  // Tensor parallelism only: the residual stream, LayerNorms and residual
  // adds on one tp-th of the micro-batch's rows (Megatron's sequence
  // parallelism; gpt_stage.hpp's TensorGroup).
  bool sequence_parallel = false;
  // Zero-bubble schedules (pipeline_schedule.hpp): backward computes the
  // input gradient only (B); weight_gradients (W) computes the weight
  // gradients later from what B left in the slot's buffers it no longer
  // needs. Not with full recomputation, which keeps nothing for W to read.
  bool split_backward = false;
  // [data] document_mask: each micro-batch comes with its tokens' positions
  // in their documents (forward's `positions`), which the embedding, RoPE
  // and attention read instead of the window's.
  bool document_mask = false;
  // Context parallelism ([parallel] cp): the stage holds 1/cp of each
  // sequence's tokens, chunks r and 2 cp - 1 - r of 2 cp (cp rank r), laid
  // out chunk-major [2, B, seq_len / (2 cp)] and given with their global
  // positions; attention runs across the group (gpt_stage.hpp's
  // ContextGroup), keeping each query row's log-sum-exp.
  int64_t cp = 1;
  // Whether forward takes each token's position (the window's own order
  // holds neither a document's nor a context rank's).
  bool positions_given() const { return document_mask || cp > 1; }
};

// Whether ZeRO stage `zero` keeps the blocks' weights in windows (the
// stage's window_weights; the planner and the accounting ask the same).
inline bool windows_weights(int64_t zero) { return zero >= 3; }
// Whether it sends the vocabulary's gradients through the gradient windows
// (window_vocab_grads; at zero 3 its weights go through the weight windows
// too, window_weights): from zero 2, and at zero 1 with 16-bit gradients
// ([train] grad_dtype = bf16), which sums them in 16 bits.
inline bool windows_vocab_grads(int64_t zero, bool grad16 = false) {
  return zero >= 2 || (zero == 1 && grad16);
}

// The options a deck asks for, with `slots` from the schedule: ZeRO's
// level decides which buffers live outside the stage or in windows.
inline StageOptions stage_options(int64_t micro_batch, const SlotKinds& slots, Recompute recompute,
                                  int zero, bool sequence_parallel = false,
                                  bool split_backward = false) {
  StageOptions o;
  o.sequence_parallel = sequence_parallel;
  o.split_backward = split_backward;
  o.micro_batch = micro_batch;
  o.slots = slots;
  o.recompute = recompute;
  o.external_master = zero >= 1;
  o.window_grads = zero >= 2;
  o.window_vocab_grads = windows_vocab_grads(zero);
  o.window_weights = windows_weights(zero);
  return o;
}

}  // namespace mpiformer
