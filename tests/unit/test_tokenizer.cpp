// Tokenizers. Expected GPT-2 ids come from an independent implementation
// (the js-tiktoken package's "gpt2" encoding, run once by hand); the whole
// Tiny Shakespeare corpus is compared through its token count and an FNV-1a
// hash of the id sequence computed by the same reference.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "reference.hpp"
#include "tokenizer.hpp"

namespace mpiformer::test {
namespace {

const std::string kVocabDir = MPIFORMER_SOURCE_DIR "/inputs/gpt2";

std::string corpus() {
  std::ifstream in(MPIFORMER_SOURCE_DIR "/inputs/tinyshakespeare.txt", std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ByteTokenizer, RoundTripsEveryByte) {
  const auto tok = make_tokenizer("byte", "");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto ids = tok->encode(all);
  ASSERT_EQ(ids.size(), 256u);
  EXPECT_EQ(ids[200], 200u);
  EXPECT_EQ(tok->decode(ids), all);
}

TEST(Gpt2Tokenizer, KnownIds) {
  const auto tok = make_tokenizer("gpt2", kVocabDir);
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->end_of_text(), 50256);
  const std::vector<std::pair<std::string, std::vector<uint32_t>>> cases = {
      {"Hello world", {15496, 995}},
      {"I'm here, they're gone and we'll see; it's 2026.",
       {40, 1101, 994, 11, 484, 821, 3750, 290, 356, 1183, 766, 26, 340, 338, 1160, 2075, 13}},
      {"  multiple   spaces\n\nnewlines\t tab",
       {220, 3294, 220, 220, 9029, 198, 198, 3605, 6615, 197, 7400}},
      {"1234567 numbers 3.14159", {10163, 2231, 3134, 3146, 513, 13, 1415, 19707}},
      {"na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac "
       "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xf0\x9f\x99\x82",
       {2616, 38776, 40304, 851, 10545, 251, 109, 12859, 105, 12466, 253, 21169, 18849, 38857,
        16843, 20375, 32485}},
      {"don't DON'T You've ", {9099, 470, 23917, 6, 51, 921, 1053, 220}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok->encode(text), ids) << text;
    EXPECT_EQ(tok->decode(ids), text);
  }
}

TEST(Gpt2Tokenizer, CorpusMatchesReferenceAndRoundTrips) {
  const auto tok = make_tokenizer("gpt2", kVocabDir);
  const std::string text = corpus();
  ASSERT_GT(text.size(), 1000000u);
  const auto ids = tok->encode(text);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint32_t id : ids) h = (h ^ id) * 0x100000001b3ULL;
  EXPECT_EQ(ids.size(), 338025u);
  EXPECT_EQ(h, 0xb547ad363c19676eULL);
  EXPECT_EQ(tok->decode(ids), text);
}

// prep streams a document in parts cut where the tokenizer says
// (last_cut): the parts' ids must be the whole's. Fed in pieces of
// pseudo-random sizes, the corpus gives the reference hash above, and text
// of nothing but whitespace runs, letters, digits, punctuation and a
// two-byte letter gives encode()'s ids for the whole.
std::vector<uint32_t> streamed(const Tokenizer& tok, const std::string& text, unsigned seed) {
  std::vector<uint32_t> ids;
  std::string carry;
  int64_t offset = 0;
  for (size_t at = 0; at < text.size();) {
    seed = seed * 1103515245u + 12345u;
    const size_t n = std::min<size_t>(1 + (seed >> 8) % 3000, text.size() - at);
    carry.append(text, at, n);
    at += n;
    const size_t cut = at == text.size() ? carry.size() : tok.last_cut(carry, offset);
    if (cut == 0) continue;
    const auto part = tok.encode_part(std::string_view(carry).substr(0, cut), offset);
    ids.insert(ids.end(), part.begin(), part.end());
    carry.erase(0, cut);
    offset += static_cast<int64_t>(cut);
  }
  return ids;
}

TEST(Gpt2Tokenizer, PartsAtItsCutsGiveTheWholesIds) {
  const auto tok = make_tokenizer("gpt2", kVocabDir);
  const auto ids = streamed(*tok, corpus(), 1);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint32_t id : ids) h = (h ^ id) * 0x100000001b3ULL;
  EXPECT_EQ(ids.size(), 338025u);
  EXPECT_EQ(h, 0xb547ad363c19676eULL);
  const char* bits[] = {"a", "b", " ", "  ", "\n", "\n\n", "\t", ".", "7", "'s", "\xc3\xa9", "\r\n"};
  std::string mixed;
  unsigned seed = 9;
  for (int i = 0; i < 40000; ++i) {
    seed = seed * 1103515245u + 12345u;
    mixed += bits[(seed >> 16) % (sizeof bits / sizeof bits[0])];
  }
  for (unsigned s : {2u, 3u, 4u}) EXPECT_EQ(streamed(*tok, mixed, s), tok->encode(mixed)) << s;
  const auto bytes = make_tokenizer("byte", "");
  EXPECT_EQ(streamed(*bytes, mixed, 5), bytes->encode(mixed));
}

TEST(Gpt2Tokenizer, InvalidUtf8IsAnInputError) {
  const auto tok = make_tokenizer("gpt2", kVocabDir);
  EXPECT_THROW(tok->encode("abc \xff\xfe def"), InputError);
}

TEST(Gpt2Tokenizer, MissingVocabularyNamesTheFile) {
  try {
    make_tokenizer("gpt2", "/nonexistent-dir");
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/encoder.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace mpiformer::test
