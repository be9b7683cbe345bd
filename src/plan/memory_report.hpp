// The run's memory, predicted and measured. Rank 0 prints, at the start,
// what a rank of each stage will allocate (rank_memory: parameters,
// gradients, AdamW moments, activations: slots of up to a whole chunk's
// each, scratch) and
// records it in metrics.jsonl; at the end, what each rank's resident memory
// grew by over its baseline (taken before anything was allocated), against
// that prediction. Host memory only: a GPU's allocator peak is not read yet.
#pragma once
#include <functional>
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

// This process's resident memory now (bytes).
double resident_bytes();
// The kernel's high-water mark of it (VmHWM), and its reset to what the
// process holds now (Linux: /proc/self/clear_refs 5; false where that is
// refused), so a probe's peak is its own and not an earlier one's.
double resident_high_water();
bool reset_resident_peak();
// The run's peak so far: the high-water mark, less what ran under
// excluding_from_peak (a probe that is not the run's: MFU's peak GEMM,
// whose operands the accounting does not hold). That keeps the mark so
// far, runs `f`, and resets the mark; where the reset is refused, f's
// bytes stay in.
double peak_resident_bytes();
double excluding_from_peak(const std::function<double()>& f);

}  // namespace mpiformer
