#include "sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>
#include <xxhash.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/input_file.hpp"

namespace mpiformer {

// SentencePiece models are kilobytes to a few megabytes (Llama 2's: 0.5
// MB); the library reads the whole file into memory, so a larger one is
// refused before anything reads it.
constexpr std::uintmax_t kMaxModelBytes = 1u << 30;

std::string sentencepiece_name(const std::string& model_path) {
  require_regular_file(model_path, "--tokenizer-model", "a SentencePiece model");
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(model_path, ec);
  if (ec || size > kMaxModelBytes)
    throw InputError(model_path, "--tokenizer-model",
                     "larger than 1 GiB (or unreadable): not a SentencePiece model");
  // The content's hash, read in blocks.
  std::ifstream in(model_path, std::ios::binary);
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<char> block(1 << 16);
  while (in.read(block.data(), static_cast<std::streamsize>(block.size())) || in.gcount() > 0)
    XXH64_update(state, block.data(), static_cast<size_t>(in.gcount()));
  const uint64_t digest = XXH64_digest(state);
  XXH64_freeState(state);
  return strprintf("sentencepiece:%016llx", static_cast<unsigned long long>(digest));
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
