// The run's memory, predicted and measured. Rank 0 prints, at the start,
// what a rank of each stage will allocate (rank_memory: parameters,
// gradients, AdamW moments, activations = slots x per slot, scratch) and
// records it in metrics.jsonl; at the end, what each rank's resident memory
// grew by over its baseline (taken before anything was allocated), against
// that prediction. Host memory only: a GPU's allocator peak is not read yet.
#pragma once
#include <string>
#include <vector>

#include "deck.hpp"
#include "plan/rank_memory.hpp"

namespace mpiformer {

// Every stage's prediction for this deck, layout and back end.
std::vector<RankMemory> predicted_memory(const Deck& deck, const BackendChoice& backend);
// The table rank 0 prints, and the same as one JSON object.
std::string memory_table(const std::vector<RankMemory>& stages);
std::string memory_json(const std::vector<RankMemory>& stages);

// This process's resident memory now, and its peak so far (bytes).
double resident_bytes();
double peak_resident_bytes();

}  // namespace mpiformer
