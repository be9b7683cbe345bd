// What a stage's activation slots hold over a step, for the memory each
// needs. The model's first chunk (stage 0's chunk 0, the embedding's) and
// its last (the last stage's last chunk, the head's) may lack layers
// (core/layer_chunks.hpp: Meta's cut of Llama 3 405B takes one off each).
// A slot that only ever holds the stage's chunk 0, or only its last chunk,
// keeps only that chunk's layers; one that holds both kinds of micro-batch
// over the step keeps a whole chunk. The stage (model/gpt_stage_impl.hpp)
// allocates by these counts and the accounting (model/stage_footprint.cpp)
// adds them up; pipeline_schedule.hpp's slot_kinds counts them for a
// schedule and numbers the slots in this order: `both` first (only a chunk
// that is the stage's first and its last: one chunk a stage), then
// `first` (only chunk 0), then `last` (only the last chunk), then the rest.
#pragma once

namespace mpiformer {

struct SlotKinds {
  int count = 1;  // the slots: micro-batches (chunks) in flight at once
  int both = 0, first = 0, last = 0;

  // Every chunk slot k holds is the stage's chunk 0 / its last chunk.
  bool first_only(int k) const { return k < both + first; }
  bool last_only(int k) const { return k < both || (k >= both + first && k < both + first + last); }
  // `count` slots that may hold any chunk (no schedule to ask).
  static SlotKinds any(int count) {
    SlotKinds s;
    s.count = count;
    return s;
  }
};

}  // namespace mpiformer
