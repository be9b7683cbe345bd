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

}  // namespace mpiformer
