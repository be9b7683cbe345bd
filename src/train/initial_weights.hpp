// [model] init: the pretrained weights a fresh run starts from (fine-tuning,
// as llm.c starts from GPT-2's). Each rank reads only the blocks of its
// tensor slices (its shard's rows under ZeRO) from a Hugging Face or llm.c
// file, or restores the weights alone of an mpiformer checkpoint through
// the sharded restore (checksums verified); the AdamW moments start at zero
// and the data at its first sample. Any layout reads any file.
#pragma once
#include <string>

#include "deck.hpp"
#include "parallel/process_grid.hpp"
#include "train/stage_backend.hpp"

namespace mpiformer {

// Collective over the world; input errors are every rank's. Returns a line
// for the log saying what was read.
std::string load_initial_weights(const Deck& deck, StageBackend& stage, ProcessGrid& grid);

}  // namespace mpiformer
