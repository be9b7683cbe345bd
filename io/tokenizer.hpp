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
#include <string_view>
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

  // A document in parts (prep streams text and splits it over ranks): a
  // cut is a place in a document where encoding the text on each side on
  // its own gives the tokens of encoding it whole. last_cut: the last cut
  // in (0, text.size()] that `text` alone decides, where text starts at
  // byte `doc_offset` of its document; 0 when it holds none yet.
  // encode_part: the tokens of text that starts and ends at cuts (its
  // document's bytes from doc_offset). encode(t) == encode_part(t, 0).
  virtual size_t last_cut(std::string_view text, int64_t doc_offset) const = 0;
  virtual std::vector<uint32_t> encode_part(std::string_view text, int64_t doc_offset) const {
    (void)doc_offset;
    return encode(std::string(text));
  }
};

// GPT-2's pre-tokenizer never joins the two sides of a space or a line end
// between printable ASCII characters ("a b": "a", " b"; "a\nb": "a",
// "\n", "b"): the last such place in text, 0 if none. Shared by the
// byte-level BPE and anything whose pieces never cross them.
size_t last_word_boundary(std::string_view text);

// The directory `prep` looks in for encoder.json and vocab.bpe by default.
std::string default_gpt2_vocab_dir();

// `name` is "byte", "gpt2" or "sentencepiece" (or a dataset's recorded
// "sentencepiece:<hash>", whose model file must then be that one);
// vocab_dir holds the GPT-2 files, model the SentencePiece model.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& vocab_dir,
                                          const std::string& model = "");

}  // namespace mpiformer
