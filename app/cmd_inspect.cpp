#include <algorithm>
#include <cstdio>

#include "core/error.hpp"

#include "checkpoint.hpp"
#include "commands.hpp"
#include "token_dataset.hpp"
#include "tokenizer.hpp"

namespace mpiformer {

namespace {

int inspect_dataset(const std::string& file, int tokens) {
  TokenDataset d(file);
  std::printf("file:      %s\n", file.c_str());
  std::printf("format:    %s\n", d.format().c_str());
  std::printf("tokens:    %lld\n", static_cast<long long>(d.num_tokens()));
  std::printf("vocab:     %lld\n", static_cast<long long>(d.vocab_size()));
  std::printf("tokenizer: %s\n", d.tokenizer().c_str());
  if (const int64_t docs = d.num_documents(); docs > 0) {
    std::printf("documents: %lld recorded, %.1f tokens each on average\n", static_cast<long long>(docs),
                static_cast<double>(d.num_tokens()) / static_cast<double>(docs));
  } else {
    std::printf("documents: none recorded (%s)\n", d.document_source() == "none"
                                                       ? "one per file under [data] document_mask"
                                                       : d.document_source().c_str());
  }
  // Training checks ids as it reads them; inspect reads every one.
  const int64_t max_id = d.verify_token_range();
  std::printf("ids:       all below vocab_size (largest %lld)\n", static_cast<long long>(max_id));
  const int64_t n = std::min<int64_t>(tokens, d.num_tokens());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  d.read_tokens(0, n, ids.data());
  std::printf("first %lld ids:", static_cast<long long>(n));
  for (int32_t id : ids) std::printf(" %d", id);
  std::printf("\n");
  if (d.tokenizer() == "byte" || d.tokenizer() == "gpt2") {
    const auto tok = make_tokenizer(d.tokenizer(), default_gpt2_vocab_dir());
    std::printf("decoded:   %s\n",
                tok->decode(std::vector<uint32_t>(ids.begin(), ids.end())).c_str());
  }
  return 0;
}

}  // namespace

int run_inspect(const InspectArgs& args, int rank) {
  if (rank != 0) return 0;
  if (args.files.size() == 1) {  // the error, if any, is the program's
    const std::string& f = args.files[0];
    return is_checkpoint(f) ? inspect_checkpoint(f) : inspect_dataset(f, args.tokens);
  }
  // Several: each one's verdict, and exit 2 if any failed.
  int rc = 0;
  for (size_t k = 0; k < args.files.size(); ++k) {
    const std::string& f = args.files[k];
    if (k > 0) std::printf("\n");
    std::fflush(stdout);
    try {
      rc = std::max(rc, is_checkpoint(f) ? inspect_checkpoint(f) : inspect_dataset(f, args.tokens));
    } catch (const InputError& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "mpiformer: error: %s\n", e.what());
      rc = 2;
    }
  }
  return rc;
}

}  // namespace mpiformer
