// A SentencePiece model (Llama 2's tokenizer and its kind: BPE or unigram
// over raw text, whitespace as "▁"), through the library itself
// (libsentencepiece), so ids are the ones spm_encode gives. Documents start
// with the model's BOS, as Llama's pipelines do. The name recorded in
// datasets and checkpoints carries the model file's content hash, so two
// datasets of different models never pass as one, and generate can check
// the model it is given.
#pragma once
#include <memory>
#include <string>

#include "tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mpiformer {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // An InputError naming `model_path` if it is not a SentencePiece model.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;
  // "sentencepiece:<xxh64 of the model file, 16 hex digits>".
  std::string name() const override { return name_; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t end_of_text() const override { return bos_; }
  // A document is encoded in pieces, each as the library encodes a string
  // on its own (it holds about 120 bytes per byte it encodes, so a
  // document of any size takes about 120 MB). The cuts are a function of
  // the document's bytes alone, so parts of it (prep's ranks) give the
  // whole's ids: the k-th cut lies in bytes [(k-1) P, k P), P =
  // kEncodePiece, after the last line end there, else before the last
  // space, else at k P (on a UTF-8 character's start). The ids at a cut
  // may differ from one encoding of the whole (the model's dummy prefix);
  // a document under P has no cut and is encoded whole, as spm_encode
  // encodes a line.
  static constexpr size_t kEncodePiece = size_t{1} << 20;
  std::vector<uint32_t> encode(const std::string& text) const override;
  size_t last_cut(std::string_view text, int64_t doc_offset) const override;
  std::vector<uint32_t> encode_part(std::string_view text, int64_t doc_offset) const override;
  std::string decode(const std::vector<uint32_t>& ids) const override;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string name_;
  int64_t vocab_ = 0, bos_ = -1;
};

// The name a model file's tokenizer has (what the constructor would give).
std::string sentencepiece_name(const std::string& model_path);

}  // namespace mpiformer
