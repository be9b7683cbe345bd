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

// Where the next piece of at most kEncodePiece bytes from `at` ends: after
// the last line's end in it, else before its last space, else at the limit
// on a UTF-8 character's start.
size_t piece_end(const std::string& text, size_t at) {
  const size_t limit = at + SentencePieceTokenizer::kEncodePiece;
  if (limit >= text.size()) return text.size();
  const size_t newline = text.rfind('\n', limit - 1);
  if (newline != std::string::npos && newline >= at) return newline + 1;
  const size_t space = text.rfind(' ', limit - 1);
  if (space != std::string::npos && space > at) return space;
  size_t cut = limit;
  while (cut > at + 1 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

std::vector<uint32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> out;
  std::vector<int> ids;
  const auto encode_piece = [&](size_t at, size_t end) {
    const auto status = sp_->Encode(text.substr(at, end - at), &ids);
    if (!status.ok()) throw InputError("", "text", "SentencePiece cannot encode it: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (text.size() <= kEncodePiece) {
    encode_piece(0, text.size());
    return out;
  }
  for (size_t at = 0; at < text.size();) {
    const size_t end = piece_end(text, at);
    encode_piece(at, end);
    at = end;
  }
  return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  const std::vector<int> v(ids.begin(), ids.end());
  const auto status = sp_->Decode(v, &text);
  if (!status.ok()) throw InputError("", "ids", "SentencePiece cannot decode them: " + status.ToString());
  return text;
}

}  // namespace mpiformer
