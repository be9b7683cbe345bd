#include "tokenizer.hpp"

#include "byte_tokenizer.hpp"
#include "core/error.hpp"
#include "gpt2_tokenizer.hpp"
#include "sentencepiece_tokenizer.hpp"

namespace mpiformer {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& vocab_dir,
                                          const std::string& model) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2") return std::make_unique<Gpt2Tokenizer>(vocab_dir);
  if (name == "sentencepiece" || name.rfind("sentencepiece:", 0) == 0) {
    if (model.empty())
      throw InputError("", "--tokenizer-model", "missing: the SentencePiece model file (.model)");
    auto t = std::make_unique<SentencePieceTokenizer>(model);
    if (name != "sentencepiece" && t->name() != name)
      throw InputError(model, "--tokenizer-model",
                       "is " + t->name() + ", but the data was tokenized by " + name +
                           " (another model file)");
    return t;
  }
  throw InputError("", "tokenizer", "expected byte, gpt2 or sentencepiece, got '" + name + "'");
}

std::string default_gpt2_vocab_dir() { return MPIFORMER_GPT2_VOCAB_DIR; }

size_t last_word_boundary(std::string_view text) {
  const auto printable = [](char c) { return c > ' ' && c < 0x7f; };
  for (size_t p = text.size() >= 2 ? text.size() - 1 : 0; p >= 2; --p) {
    // Before a space between printable characters, or after a line end
    // between printable characters.
    if (text[p] == ' ' && printable(text[p - 1]) && p + 1 < text.size() && printable(text[p + 1]))
      return p;
    if (text[p - 1] == '\n' && printable(text[p - 2]) && printable(text[p])) return p;
  }
  return 0;
}

}  // namespace mpiformer
