#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>
#include <fstream>
#include <sstream>

#include "commands.hpp"
#include "core/error.hpp"
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

// True when `a` and `b` name the same file (or would: neither exists yet
// and their normalised paths agree).
bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

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
  for (const auto& [what, out] : outputs) {
    for (const auto& in : args.inputs) {
      if (same_file(out, in)) {
        throw InputError(in, "",
                         "is both an input and " + what + " (" + out +
                             "): prep would overwrite its own text; choose another --output");
      }
    }
  }
}

}  // namespace

int run_prep(const PrepArgs& args, int rank) {
  if (rank != 0) return 0;  // one writer; other ranks of an mpirun have nothing to do
  check_outputs(args);
  const auto tok = make_tokenizer(
      args.tokenizer, args.vocab_dir.empty() ? default_gpt2_vocab_dir() : args.vocab_dir);
  std::vector<uint32_t> tokens;
  for (const auto& path : args.inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(path, "", "cannot open the text file");
    std::ostringstream ss;
    ss << in.rdbuf();
    // GPT-2 pipelines start every document with <|endoftext|>.
    if (tok->end_of_text() >= 0) tokens.push_back(static_cast<uint32_t>(tok->end_of_text()));
    try {
      const auto ids = tok->encode(ss.str());
      tokens.insert(tokens.end(), ids.begin(), ids.end());
    } catch (const InputError& e) {
      throw InputError(path, e.field(), e.reason());
    }
    std::fprintf(stderr, "prep: %s: %zu tokens so far\n", path.c_str(), tokens.size());
  }
  const auto n_val = static_cast<size_t>(args.val_fraction * static_cast<double>(tokens.size()));
  const std::vector<uint32_t> train(tokens.begin(), tokens.end() - static_cast<long>(n_val));
  write_token_file(args.output, train, tok->vocab_size(), tok->name());
  std::printf("wrote %s: %zu tokens, vocab %lld, tokenizer %s\n", args.output.c_str(), train.size(),
              static_cast<long long>(tok->vocab_size()), tok->name().c_str());
  if (n_val > 0) {
    const std::vector<uint32_t> val(tokens.end() - static_cast<long>(n_val), tokens.end());
    const std::string vpath = val_output_path(args.output);
    write_token_file(vpath, val, tok->vocab_size(), tok->name());
    std::printf("wrote %s: %zu tokens (the last %.1f%%, validation)\n", vpath.c_str(), val.size(),
                100.0 * args.val_fraction);
  }
  return 0;
}

}  // namespace mpiformer
