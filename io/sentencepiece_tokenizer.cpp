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

namespace {

// The cut in document bytes [lo, lo + P), given as `window` (all of it):
// its offset from lo, in (0, P].
size_t cut_in(std::string_view window) {
  const size_t newline = window.rfind('\n');
  if (newline != std::string_view::npos) return newline + 1;
  const size_t space = window.rfind(' ');
  if (space != std::string_view::npos && space > 0) return space;
  // At the window's end if its last character ends there, else before it.
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(window[i]); };
  size_t last = window.size() - 1;
  while (last > 0 && (byte(last) & 0xC0) == 0x80) --last;
  const unsigned char lead = byte(last);
  const size_t len = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
  return last + len == window.size() || last == 0 ? window.size() : last;
}

}  // namespace

size_t SentencePieceTokenizer::last_cut(std::string_view text, int64_t doc_offset) const {
  // The windows [(k-1) P, k P) that lie inside text decide their cuts.
  const auto P = static_cast<int64_t>(kEncodePiece);
  const int64_t end = doc_offset + static_cast<int64_t>(text.size());
  int64_t k = end / P;  // the last window ending inside text
  while (k >= 1 && (k - 1) * P >= doc_offset) {
    const int64_t lo = (k - 1) * P;
    const size_t cut = cut_in(text.substr(static_cast<size_t>(lo - doc_offset), kEncodePiece));
    const int64_t at = lo + static_cast<int64_t>(cut);
    if (at > doc_offset) return static_cast<size_t>(at - doc_offset);
    --k;
  }
  return 0;
}

std::vector<uint32_t> SentencePieceTokenizer::encode_part(std::string_view text,
                                                          int64_t doc_offset) const {
  std::vector<uint32_t> out;
  std::vector<int> ids;
  const auto encode_piece = [&](std::string_view piece) {
    const auto status = sp_->Encode(std::string(piece), &ids);
    if (!status.ok()) throw InputError("", "text", "SentencePiece cannot encode it: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  };
  // The cuts inside the part, in order: each window's that falls in it.
  const auto P = static_cast<int64_t>(kEncodePiece);
  const int64_t end = doc_offset + static_cast<int64_t>(text.size());
  int64_t at = doc_offset;
  for (int64_t k = doc_offset / P + 1; k * P <= end; ++k) {
    const int64_t lo = (k - 1) * P;
    if (lo < doc_offset) continue;  // a window the part starts inside: its cut is before
    const int64_t cut = lo + static_cast<int64_t>(cut_in(
                                 text.substr(static_cast<size_t>(lo - doc_offset), kEncodePiece)));
    if (cut <= at || cut >= end) continue;
    encode_piece(text.substr(static_cast<size_t>(at - doc_offset), static_cast<size_t>(cut - at)));
    at = cut;
  }
  if (at < end) encode_piece(text.substr(static_cast<size_t>(at - doc_offset)));
  return out;
}

std::vector<uint32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  return encode_part(text, 0);
}

std::string SentencePieceTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string text;
  const std::vector<int> v(ids.begin(), ids.end());
  const auto status = sp_->Decode(v, &text);
  if (!status.ok()) throw InputError("", "ids", "SentencePiece cannot decode them: " + status.ToString());
  return text;
}

}  // namespace mpiformer
