#pragma once
#include "tokenizer.hpp"

namespace mpiformer {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  int64_t end_of_text() const override { return -1; }
  std::vector<uint32_t> encode(const std::string& text) const override;
  // One token per byte: any place is a cut.
  size_t last_cut(std::string_view text, int64_t) const override { return text.size(); }
  std::string decode(const std::vector<uint32_t>& ids) const override;
};

}  // namespace mpiformer
