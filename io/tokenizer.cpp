#include "tokenizer.hpp"

#include "byte_tokenizer.hpp"
#include "core/error.hpp"
#include "gpt2_tokenizer.hpp"

namespace mpiformer {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& vocab_dir) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2") return std::make_unique<Gpt2Tokenizer>(vocab_dir);
  throw InputError("", "tokenizer", "expected byte or gpt2, got '" + name + "'");
}

std::string default_gpt2_vocab_dir() { return MPIFORMER_GPT2_VOCAB_DIR; }

}  // namespace mpiformer
