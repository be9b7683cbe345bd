// prep's corpus: the inputs cut into units a rank tokenizes on its own,
// and the streaming of a unit's documents through the tokenizer into a
// sink, in bounded memory whatever the sizes of files and lines.
//
// Inputs are plain text (one document per file), JSON lines (one document
// per line, its text in a named string field), either of them gzip- or
// zstd-compressed (found from the magic bytes). A plain file is cut into
// units at the tokenizer's cuts (Tokenizer::last_cut), a JSON-lines file
// at line ends; a compressed file is one unit. The tokens of the units in
// order are those of the inputs tokenized whole, one after another:
// whatever the number of ranks, the same stream.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "text_stream.hpp"
#include "tokenizer.hpp"

namespace mpiformer {

enum class InputFormat { kText, kJsonLines };

struct PrepInput {
  std::string path;
  InputFormat format = InputFormat::kText;
  Compression compression = Compression::kNone;
  int64_t bytes = 0;  // on disk
};

// JSON lines by name (.jsonl or .ndjson, before any .gz or .zst), plain
// text otherwise; each a regular file (InputError naming it).
PrepInput describe_input(const std::string& path);

// Bytes [begin, end) of input `input` (end -1: to the end).
struct PrepUnit {
  int64_t input = 0, begin = 0, end = -1;
};

// Units of about `target` bytes (plain files cut at the tokenizer's cuts
// or line ends near each multiple of it), in input order.
std::vector<PrepUnit> plan_units(const std::vector<PrepInput>& inputs, const Tokenizer& tok,
                                 int64_t target);

struct PrepOptions {
  std::string json_field = "text";  // JSON lines: the document's text
  bool skip_bad_lines = false;      // count them instead of stopping
};

// Where a unit's tokens go, in order: `document()` before each document's
// first token.
struct TokenSink {
  std::function<void()> document;
  std::function<void(const uint32_t*, size_t)> tokens;
};

struct UnitStats {
  int64_t bytes = 0;      // of text read (decompressed)
  int64_t bad_lines = 0;  // JSON lines skipped (skip_bad_lines)
  int64_t forced_cuts = 0;  // text cut where the tokenizer had no cut for kMaxCarry bytes
};

// The longest text prep holds without a cut (plain text) or a JSON line.
constexpr int64_t kMaxCarry = int64_t{64} << 20;

// Tokenizes one unit. A plain file's unit at byte 0 starts its document
// (the tokenizer's end-of-text or BOS token first). `progress(bytes)` after
// each piece. InputError naming the file (and the line of a bad JSON line).
UnitStats tokenize_unit(const PrepInput& input, const PrepUnit& unit, const Tokenizer& tok,
                        const PrepOptions& options, const TokenSink& sink,
                        const std::function<void(int64_t)>& progress);

}  // namespace mpiformer
