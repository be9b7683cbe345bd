#include "sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <xxhash.h>

#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/input_file.hpp"

namespace mpiformer {

std::string sentencepiece_name(const std::string& model_path) {
  require_regular_file(model_path, "--tokenizer-model", "a SentencePiece model");
  std::ifstream in(model_path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string data = bytes.str();
  return strprintf("sentencepiece:%016llx",
                   static_cast<unsigned long long>(XXH64(data.data(), data.size(), 0)));
}

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()),
      name_(sentencepiece_name(model_path)) {
  const auto status = sp_->Load(model_path);
  if (!status.ok())
    throw InputError(model_path, "--tokenizer-model",
                     std::string("not a SentencePiece model: ") + status.ToString());
  vocab_ = sp_->GetPieceSize();
  bos_ = sp_->bos_id();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<uint32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw InputError("", "text", "SentencePiece cannot encode it: " + status.ToString());
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  const std::vector<int> v(ids.begin(), ids.end());
  const auto status = sp_->Decode(v, &text);
  if (!status.ok()) throw InputError("", "ids", "SentencePiece cannot decode them: " + status.ToString());
  return text;
}

}  // namespace mpiformer
