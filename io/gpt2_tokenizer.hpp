// GPT-2 byte-level BPE. The pre-tokenizer is GPT-2's regular expression,
// run by PCRE2 with Unicode properties; each piece is mapped byte by byte to
// printable characters (GPT-2's bytes_to_unicode), then merged by rank.
#pragma once
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8  // UTF-8 text
#endif
#include <pcre2.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer.hpp"

namespace mpiformer {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(const std::string& vocab_dir);
  ~Gpt2Tokenizer() override;
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  std::string name() const override { return "gpt2"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  int64_t end_of_text() const override { return eot_; }
  // Text must be valid UTF-8 (GPT-2 encodes decoded text); InputError otherwise.
  std::vector<uint32_t> encode(const std::string& text) const override;
  size_t last_cut(std::string_view text, int64_t) const override {
    return last_word_boundary(text);
  }
  std::string decode(const std::vector<uint32_t>& ids) const override;

 private:
  void bpe(const std::string& piece, std::vector<uint32_t>& out) const;

  std::unordered_map<std::string, uint32_t> encoder_;  // byte-level symbol -> id
  std::vector<std::string> decoder_;                    // id -> raw bytes
  std::unordered_map<std::string, int> ranks_;          // "left right" -> merge rank
  std::string byte_symbol_[256];                        // byte -> its UTF-8 symbol
  int64_t eot_ = -1;
  pcre2_code* regex_ = nullptr;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache_;
  static constexpr size_t kCacheEntries = size_t{1} << 20;  // about 100 MB at most
};

}  // namespace mpiformer
