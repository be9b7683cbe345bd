#include "gpt2_tokenizer.hpp"

#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/format.hpp"

namespace mpiformer {
namespace {

// GPT-2's pre-tokenizer: contractions, letters, numbers, other symbols, each
// with an optional leading space; runs of white space.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others
// for code points from 256 up, so every token is printable text.
void byte_to_codepoint(uint32_t table[256]) {
  bool direct[256] = {};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? static_cast<uint32_t>(b) : next++;
}

std::string read_file(const std::string& path) {
  require_regular_file(path, "", "a GPT-2 tokenizer file");  // a FIFO would block the open
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(path, "", "cannot open (GPT-2 tokenizer files: pass --vocab-dir DIR "
                               "holding encoder.json and vocab.bpe)");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_dir) {
  uint32_t cp[256];
  byte_to_codepoint(cp);
  std::unordered_map<uint32_t, unsigned char> to_byte;
  for (int b = 0; b < 256; ++b) {
    append_utf8(byte_symbol_[b], cp[b]);
    to_byte[cp[b]] = static_cast<unsigned char>(b);
  }

  const std::string enc_path = vocab_dir + "/encoder.json";
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(read_file(enc_path));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(enc_path, "", std::string("not valid JSON: ") + e.what());
  }
  if (!enc.is_object()) throw InputError(enc_path, "", "expected an object {token: id}");
  decoder_.resize(enc.size());
  for (const auto& [symbol, id_json] : enc.items()) {
    if (!id_json.is_number_unsigned() || id_json.get<uint64_t>() >= enc.size()) {
      throw InputError(enc_path, symbol, "expected an id below the vocabulary size");
    }
    const auto id = id_json.get<uint32_t>();
    encoder_[symbol] = id;
    // Back from printable symbols to raw bytes, code point by code point.
    std::string raw;
    for (size_t i = 0; i < symbol.size();) {
      const auto c = static_cast<unsigned char>(symbol[i]);
      uint32_t v;
      int len;
      if (c < 0x80) { v = c; len = 1; }
      else if (c < 0xE0) { v = ((c & 0x1F) << 6) | (symbol[i + 1] & 0x3F); len = 2; }
      else { v = ((c & 0x0F) << 12) | ((symbol[i + 1] & 0x3F) << 6) | (symbol[i + 2] & 0x3F); len = 3; }
      const auto it = to_byte.find(v);
      // Special tokens such as <|endoftext|> are plain ASCII and map to themselves.
      raw.push_back(it != to_byte.end() ? static_cast<char>(it->second) : static_cast<char>(v));
      i += len;
    }
    decoder_[id] = raw;
  }
  if (auto it = encoder_.find("<|endoftext|>"); it != encoder_.end()) eot_ = it->second;

  const std::string bpe_path = vocab_dir + "/vocab.bpe";
  std::istringstream merges(read_file(bpe_path));
  std::string line;
  int rank = 0, lineno = 0;
  while (std::getline(merges, line)) {
    ++lineno;
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos) {
      throw InputError(bpe_path, "line " + std::to_string(lineno), "expected 'left right'");
    }
    ranks_.emplace(line, rank++);
  }

  int err = 0;
  PCRE2_SIZE off = 0;
  regex_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  MPIFORMER_CHECK(regex_ != nullptr, "pcre2_compile of the GPT-2 pattern");
  pcre2_jit_compile(regex_, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back silently
}

Gpt2Tokenizer::~Gpt2Tokenizer() { pcre2_code_free(regex_); }

void Gpt2Tokenizer::bpe(const std::string& piece, std::vector<uint32_t>& out) const {
  if (auto it = cache_.find(piece); it != cache_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<std::string> word;
  for (unsigned char b : piece) word.push_back(byte_symbol_[b]);
  std::string key;
  while (word.size() > 1) {
    // The adjacent pair with the lowest merge rank is merged everywhere.
    int best = INT_MAX;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      key = word[i];
      key += ' ';
      key += word[i + 1];
      const auto it = ranks_.find(key);
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        best_i = i;
      }
    }
    if (best == INT_MAX) break;
    const std::string first = word[best_i], second = word[best_i + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word.swap(merged);
  }
  std::vector<uint32_t> ids;
  for (const auto& s : word) ids.push_back(encoder_.at(s));
  out.insert(out.end(), ids.begin(), ids.end());
  // Bounded: a corpus of any size has too many distinct rare words to keep.
  if (cache_.size() >= kCacheEntries) cache_.clear();
  cache_.emplace(piece, std::move(ids));
}

std::vector<uint32_t> Gpt2Tokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex_, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE pos = 0;
  // PCRE2 validates the UTF-8 of the whole subject on every call unless told
  // not to: check it on the first match only, or encoding is quadratic.
  uint32_t options = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(regex_, subject, text.size(), pos, options, md, nullptr);
    options = PCRE2_NO_UTF_CHECK;
    if (rc < 0) {
      const PCRE2_SIZE bad = pcre2_get_startchar(md);
      pcre2_match_data_free(md);
      if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
        throw InputError("", "byte " + std::to_string(bad),
                         "text is not valid UTF-8 (the gpt2 tokenizer encodes text)");
      }
      throw SystemError("pcre2_match failed with code " + std::to_string(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    bpe(text.substr(ov[0], ov[1] - ov[0]), out);
    pos = ov[1] > pos ? ov[1] : pos + 1;
  }
  pcre2_match_data_free(md);
  return out;
}

std::string Gpt2Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  std::string s;
  for (uint32_t id : ids) {
    if (id < decoder_.size()) s += decoder_[id];
  }
  return s;
}

}  // namespace mpiformer
