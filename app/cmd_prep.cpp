#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>
#include <fstream>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/output_path.hpp"
#include "core/format.hpp"
#include "core/host_memory.hpp"
#include "megatron_dataset.hpp"
#include "token_dataset.hpp"
#include "tokenizer.hpp"

namespace mpiformer {

std::string val_output_path(const std::string& out) {
  const auto dot = out.rfind('.');
  const auto slash = out.rfind('/');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return has_ext ? out.substr(0, dot) + "_val" + out.substr(dot) : out + "_val";
}

namespace {

// Memory prep needs per byte of text at most: the text, one 4-byte id per
// byte (the byte tokenizer) and the copy written as the training split.
constexpr int kBytesPerTextByte = 9;

// Checked before anything is read or written: prep must never replace its
// own input, and a fraction that is not a number passes a range check.
void check_outputs(const PrepArgs& args) {
  if (!(args.val_fraction >= 0.0 && args.val_fraction <= 0.5)) {
    throw InputError("--val-fraction", "",
                     "expected a number in [0, 0.5], got " + std::to_string(args.val_fraction));
  }
  std::vector<std::pair<std::string, std::string>> outputs = {{"--output", args.output}};
  if (args.val_fraction > 0) {
    outputs.emplace_back("the validation split (--val-fraction)", val_output_path(args.output));
  }
  if (args.format == "megatron") {
    // Each output is a .bin and an .idx.
    for (size_t i = 0, n = outputs.size(); i < n; ++i) {
      const std::string& out = outputs[i].second;
      const bool bin = out.size() > 4 && out.compare(out.size() - 4, 4, ".bin") == 0;
      outputs.emplace_back(outputs[i].first, (bin ? out.substr(0, out.size() - 4) : out) + ".idx");
    }
  }
  std::vector<std::string> inputs = args.inputs;
  if (!args.tokenizer_model.empty()) inputs.push_back(args.tokenizer_model);
  for (const auto& [what, out] : outputs) {
    for (const auto& in : inputs) {
      if (same_file(out, in)) {
        throw InputError(in, "",
                         "is both an input and " + what + " (" + out +
                             "): prep would overwrite its own text; choose another --output");
      }
    }
  }
}

// Appends the bytes of `path` to `text`, refusing to go past `limit` bytes
// in all: prep holds a corpus in memory, and an endless input (a device, a
// pipe that never closes) must end with a message, not bad_alloc.
void read_text(const std::string& path, std::string& text, double limit) {
  // Before the open, which blocks on a FIFO without a writer.
  require_regular_file(path, "", "a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in || std::filesystem::is_directory(path)) {
    throw InputError(path, "", "cannot open the text file");
  }
  std::vector<char> chunk(1 << 20);
  while (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0) {
    text.append(chunk.data(), static_cast<size_t>(in.gcount()));
    if (static_cast<double>(text.size()) > limit) {
      throw InputError(path, "",
                       strprintf("more than %.2f GB of text so far, the most prep takes here "
                                 "(--max-text-gb, by default what memory allows at about %d "
                                 "bytes per byte of text): split the "
                                 "corpus, prep each part to its own file, and give [data] train "
                                 "a glob of them (is this input endless, a device or a pipe?)",
                                 limit / 1e9, kBytesPerTextByte));
    }
  }
}

// Writes tokens [begin, end) in the chosen format; `starts` are where the
// documents start in the whole token list (a document cut by `begin`
// continues as the first).
void write_split(const PrepArgs& args, const std::string& path, const std::vector<uint32_t>& tokens,
                 size_t begin, size_t end, const std::vector<int64_t>& starts,
                 const Tokenizer& tok) {
  const std::vector<uint32_t> part(tokens.begin() + static_cast<long>(begin),
                                   tokens.begin() + static_cast<long>(end));
  // Each document's first token in the part, increasing (an empty input
  // file starts no document of its own).
  std::vector<int64_t> docs;
  if (!part.empty()) docs.push_back(0);
  for (int64_t s : starts) {
    const auto b = static_cast<int64_t>(begin), e = static_cast<int64_t>(end);
    if (s >= e) break;
    if (s - b > docs.back()) docs.push_back(s - b);
  }
  if (args.format != "megatron")
    return write_token_file(path, part, tok.vocab_size(), tok.name(), docs);
  if (docs.empty()) docs.push_back(0);
  write_megatron_dataset(path, part, docs, tok.vocab_size());
}

}  // namespace

int run_prep(const PrepArgs& args, int rank) {
  if (rank != 0) return 0;  // one writer; other ranks of an mpirun have nothing to do
  check_outputs(args);
  if (!args.tokenizer_model.empty() && args.tokenizer != "sentencepiece")
    throw InputError(args.tokenizer_model, "--tokenizer-model",
                     "applies to --tokenizer sentencepiece only (this is " + args.tokenizer + ")");
  const auto tok = make_tokenizer(args.tokenizer,
                                  args.vocab_dir.empty() ? default_gpt2_vocab_dir() : args.vocab_dir,
                                  args.tokenizer_model);
  std::vector<uint32_t> tokens;
  const double avail = host_available_bytes();
  double text_limit = args.max_text_gb > 0 ? args.max_text_gb * 1e9
                      : avail > 0          ? avail / kBytesPerTextByte
                                           : 1e18;
  std::vector<int64_t> doc_starts;  // one document per input file
  for (const auto& path : args.inputs) {
    std::string text;
    read_text(path, text, text_limit);
    doc_starts.push_back(static_cast<int64_t>(tokens.size()));
    text_limit -= static_cast<double>(text.size());
    // GPT-2 pipelines start every document with <|endoftext|>, Llama's
    // (SentencePiece) with BOS.
    if (tok->end_of_text() >= 0) tokens.push_back(static_cast<uint32_t>(tok->end_of_text()));
    try {
      const auto ids = tok->encode(text);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
    } catch (const InputError& e) {
      throw InputError(path, e.field(), e.reason());
    }
    std::fprintf(stderr, "prep: %s: %zu tokens so far\n", path.c_str(), tokens.size());
  }
  const auto n_val = static_cast<size_t>(args.val_fraction * static_cast<double>(tokens.size()));
  const size_t n_train = tokens.size() - n_val;
  write_split(args, args.output, tokens, 0, n_train, doc_starts, *tok);
  std::printf("wrote %s: %zu tokens, vocab %lld, tokenizer %s%s\n", args.output.c_str(), n_train,
              static_cast<long long>(tok->vocab_size()), tok->name().c_str(),
              args.format == "megatron" ? " (Megatron .bin and .idx)" : "");
  if (n_val > 0) {
    const std::string vpath = val_output_path(args.output);
    write_split(args, vpath, tokens, n_train, tokens.size(), doc_starts, *tok);
    std::printf("wrote %s: %zu tokens (the last %.1f%%, validation)\n", vpath.c_str(), n_val,
                100.0 * args.val_fraction);
  }
  return 0;
}

}  // namespace mpiformer
