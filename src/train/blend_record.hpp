// The blend as a checkpoint records it (root attribute "data_blend"): each
// source's name, weight, window count and fingerprint (what it is), and the
// blend's state (where it started, each source's samples before that and
// up to the checkpoint). A resume compares what it is with the deck's
// sources, and restores the state.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mpiformer {

struct BlendEntry {
  std::string name;
  double weight = 1;
  int64_t windows = 0;
  std::string fingerprint;  // TokenDataset::fingerprint()
  int64_t base = 0;         // samples it had given when the blend started
  int64_t count = 0;        // samples it had given at the checkpoint
};

struct BlendRecord {
  int64_t start = 0;  // the global sample position where this blend began
  std::vector<BlendEntry> sources;

  // One line for the start, one tab-separated line per source.
  std::string to_text() const;
  // The text back; InputError(file, "attribute data_blend", ...) when it is
  // not one (a count or a field out of its range included).
  static BlendRecord parse(const std::string& text, const std::string& file);
  // "" when `now` blends the same sources with the same weights; else each
  // difference, named ("source \"web\": weight 0.7 in the checkpoint, 0.6
  // in the deck"; "source \"code\" is new"; ...).
  static std::string differences(const BlendRecord& recorded, const BlendRecord& now);
};

}  // namespace mpiformer
