// Tokenizers for `prep`, `inspect` and `generate`:
//  - "byte": one token per byte, vocabulary 256;
//  - "gpt2": GPT-2's byte-level BPE (encoder.json + vocab.bpe), identical
//    token for token to OpenAI's reference encoder;
//  - "sentencepiece": a SentencePiece model file (Llama 2's kind), through
//    libsentencepiece (sentencepiece_tokenizer.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mpiformer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  // The document separator, or -1 when the tokenizer has none.
  virtual int64_t end_of_text() const = 0;
  virtual std::vector<uint32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
};

// The directory `prep` looks in for encoder.json and vocab.bpe by default.
std::string default_gpt2_vocab_dir();

// `name` is "byte", "gpt2" or "sentencepiece" (or a dataset's recorded
// "sentencepiece:<hash>", whose model file must then be that one);
// vocab_dir holds the GPT-2 files, model the SentencePiece model.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& vocab_dir,
                                          const std::string& model = "");

}  // namespace mpiformer
