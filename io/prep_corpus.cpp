#include "prep_corpus.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/input_file.hpp"

namespace mpiformer {

namespace {

constexpr size_t kChunk = size_t{4} << 20;  // text read at a time

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The line of `input` that byte `at` of it is on, from 1 (an error's
// message; reads the file up to there).
int64_t line_of(const PrepInput& input, int64_t at) {
  auto in = open_text(input.path);
  std::vector<char> buf(kChunk);
  int64_t line = 1, seen = 0;
  while (seen < at) {
    const size_t got = in->read(buf.data(), buf.size());
    if (got == 0) break;
    const auto n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(got), at - seen));
    line += std::count(buf.data(), buf.data() + n, '\n');
    seen += static_cast<int64_t>(got);
  }
  return line;
}

// Bytes [at, at + n) of a plain file (fewer at its end).
std::string read_range(const PrepInput& input, int64_t at, int64_t n) {
  auto in = open_text(input.path, at, at + n);
  std::string text(static_cast<size_t>(n), '\0');
  size_t have = 0;
  while (have < text.size()) {
    const size_t got = in->read(text.data() + have, text.size() - have);
    if (got == 0) break;
    have += got;
  }
  text.resize(have);
  return text;
}

void emit(const TokenSink& sink, const std::vector<uint32_t>& ids) {
  if (!ids.empty()) sink.tokens(ids.data(), ids.size());
}

void start_document(const TokenSink& sink, const Tokenizer& tok) {
  sink.document();
  // GPT-2 pipelines start every document with <|endoftext|>, Llama's
  // (SentencePiece) with BOS.
  if (tok.end_of_text() >= 0) {
    const auto id = static_cast<uint32_t>(tok.end_of_text());
    sink.tokens(&id, 1);
  }
}

UnitStats tokenize_text(const PrepInput& input, const PrepUnit& unit, const Tokenizer& tok,
                        const TokenSink& sink, const std::function<void(int64_t)>& progress) {
  UnitStats st;
  auto in = open_text(input.path, unit.begin, unit.end);
  if (unit.begin == 0) start_document(sink, tok);
  std::string carry;
  int64_t doc_offset = unit.begin;
  std::vector<char> buf(kChunk);
  const auto encode = [&](size_t n) {
    try {
      emit(sink, tok.encode_part(std::string_view(carry).substr(0, n), doc_offset));
    } catch (const InputError& e) {
      throw InputError(input.path, e.field().rfind("byte ", 0) == 0
                                       ? strprintf("byte %lld", static_cast<long long>(
                                                                    doc_offset + std::stoll(e.field().substr(5))))
                                       : e.field(),
                       e.reason());
    }
    carry.erase(0, n);
    doc_offset += static_cast<int64_t>(n);
  };
  for (;;) {
    const size_t got = in->read(buf.data(), buf.size());
    if (got == 0) break;
    carry.append(buf.data(), got);
    st.bytes += static_cast<int64_t>(got);
    size_t cut = tok.last_cut(carry, doc_offset);
    if (cut == 0 && static_cast<int64_t>(carry.size()) >= kMaxCarry) {
      // No cut in kMaxCarry bytes (a line of one 64 MB word): memory stays
      // bounded, and the tokens at this cut may differ from whole text's.
      cut = carry.size();
      while (cut > 1 && (static_cast<unsigned char>(carry[cut - 1]) & 0xC0) == 0x80) --cut;
      if ((static_cast<unsigned char>(carry[cut - 1]) & 0xC0) == 0xC0) --cut;
      ++st.forced_cuts;
    }
    if (cut > 0) encode(cut);
    progress(static_cast<int64_t>(got));
  }
  if (!carry.empty()) encode(carry.size());
  return st;
}

UnitStats tokenize_json_lines(const PrepInput& input, const PrepUnit& unit, const Tokenizer& tok,
                              const PrepOptions& options, const TokenSink& sink,
                              const std::function<void(int64_t)>& progress) {
  UnitStats st;
  auto in = open_text(input.path, unit.begin, unit.end);
  std::string carry;
  int64_t line_base = -1;           // line number of the unit's first line, when needed
  int64_t lines = 0;                // complete lines of this unit so far
  std::vector<char> buf(kChunk);
  const auto line_number = [&] {
    if (line_base < 0) line_base = input.compression == Compression::kNone ? line_of(input, unit.begin) : 1;
    return line_base + lines;
  };
  const auto one_line = [&](std::string_view line) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;  // blank
    const auto j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
    std::string why;
    if (j.is_discarded()) {
      why = "not valid JSON";
    } else if (!j.is_object()) {
      why = "not a JSON object";
    } else if (!j.contains(options.json_field) || !j[options.json_field].is_string()) {
      why = "no string field \"" + options.json_field + "\" (--jsonl-field)";
    }
    if (!why.empty()) {
      if (options.skip_bad_lines) {
        ++st.bad_lines;
        return;
      }
      throw InputError(input.path, strprintf("line %lld", static_cast<long long>(line_number())),
                       why + " (--skip-bad-lines counts such lines and goes on)");
    }
    start_document(sink, tok);
    try {
      emit(sink, tok.encode(j[options.json_field].get<std::string>()));
    } catch (const InputError& e) {
      throw InputError(input.path, strprintf("line %lld", static_cast<long long>(line_number())),
                       e.reason());
    }
  };
  for (;;) {
    const size_t got = in->read(buf.data(), buf.size());
    carry.append(buf.data(), got);
    st.bytes += static_cast<int64_t>(got);
    size_t from = 0;
    for (size_t nl; (nl = carry.find('\n', from)) != std::string::npos; from = nl + 1) {
      one_line(std::string_view(carry).substr(from, nl - from));
      ++lines;
    }
    carry.erase(0, from);
    if (got == 0) break;
    if (static_cast<int64_t>(carry.size()) > kMaxCarry) {
      throw InputError(input.path, strprintf("line %lld", static_cast<long long>(line_number())),
                       strprintf("longer than %lld MB: a JSON line holds one document",
                                 static_cast<long long>(kMaxCarry >> 20)));
    }
    progress(static_cast<int64_t>(got));
  }
  if (!carry.empty()) one_line(carry);  // a last line without its line end
  return st;
}

}  // namespace

PrepInput describe_input(const std::string& path) {
  require_regular_file(path, "", "a text file");
  PrepInput in;
  in.path = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) in.bytes = static_cast<int64_t>(st.st_size);
  in.compression = compression_of(path);
  std::string name = path;
  for (const char* ext : {".gz", ".zst", ".zstd"})
    if (ends_with(name, ext)) name.resize(name.size() - std::strlen(ext));
  in.format = ends_with(name, ".jsonl") || ends_with(name, ".ndjson") ? InputFormat::kJsonLines
                                                                      : InputFormat::kText;
  return in;
}

std::vector<PrepUnit> plan_units(const std::vector<PrepInput>& inputs, const Tokenizer& tok,
                                 int64_t target) {
  std::vector<PrepUnit> units;
  // What is read around each place to find a cut: two of SentencePiece's
  // windows hold one of its cuts.
  const int64_t window = 2 * int64_t{1 << 20} + (64 << 10);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const PrepInput& in = inputs[i];
    const auto input = static_cast<int64_t>(i);
    if (in.compression != Compression::kNone || in.bytes <= target) {
      units.push_back({input, 0, -1});
      continue;
    }
    int64_t begin = 0;
    for (int64_t x = target; x + window < in.bytes; x += target) {
      if (x <= begin) continue;
      const std::string text = read_range(in, x, window);
      size_t cut = 0;
      if (in.format == InputFormat::kJsonLines) {
        const size_t nl = text.rfind('\n');
        cut = nl == std::string::npos ? 0 : nl + 1;
      } else {
        cut = tok.last_cut(text, x);
      }
      if (cut == 0) continue;  // none here: the unit goes on
      units.push_back({input, begin, x + static_cast<int64_t>(cut)});
      begin = x + static_cast<int64_t>(cut);
    }
    units.push_back({input, begin, -1});
  }
  return units;
}

UnitStats tokenize_unit(const PrepInput& input, const PrepUnit& unit, const Tokenizer& tok,
                        const PrepOptions& options, const TokenSink& sink,
                        const std::function<void(int64_t)>& progress) {
  return input.format == InputFormat::kJsonLines
             ? tokenize_json_lines(input, unit, tok, options, sink, progress)
             : tokenize_text(input, unit, tok, sink, progress);
}

}  // namespace mpiformer
