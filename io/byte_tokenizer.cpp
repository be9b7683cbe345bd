#include "byte_tokenizer.hpp"

namespace mpiformer {

std::vector<uint32_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (uint32_t id : ids) s.push_back(static_cast<char>(id & 0xff));
  return s;
}

}  // namespace mpiformer
