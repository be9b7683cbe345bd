#include "megatron_dataset.hpp"

#include <sys/stat.h>

#include <cstring>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "mapped_file.hpp"

namespace mpiformer {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kFixedBytes = 9 + 8 + 1 + 8 + 8;

std::string stem_of(const std::string& path) {
  for (const char* ext : {".bin", ".idx"}) {
    if (path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0) return path.substr(0, path.size() - 4);
  }
  return path;
}

// Bytes of a token of each dtype code mpiformer reads (0: not a token type).
size_t code_bytes(uint8_t code) {
  switch (code) {
    case 1: return 1;  // uint8
    case 8: return 2;  // uint16
    case 4: return 4;  // int32
    default: return 0;
  }
}

template <class T>
T at(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

class MegatronTokenSource final : public TokenSource {
 public:
  MegatronTokenSource(const std::string& bin, const std::string& idx)
      : TokenSource(bin), idx_(idx, "index (.idx)"), bin_(bin, "data (.bin)") {
    const char* p = idx_.data();
    const int64_t size = idx_.size();
    if (size < kFixedBytes || std::memcmp(p, kMagic, 9) != 0) {
      throw InputError(idx, "header", size < kFixedBytes ? "truncated: shorter than the header"
                                                        : "no MMIDIDX magic (not a Megatron index)");
    }
    const auto version = at<uint64_t>(p + 9);
    if (version != 1) {
      throw InputError(idx, "version", strprintf("expected 1, got %llu", static_cast<unsigned long long>(version)));
    }
    const auto code = static_cast<uint8_t>(p[17]);
    elem_ = code_bytes(code);
    if (elem_ == 0) {
      throw InputError(idx, "dtype code",
                       strprintf("%u: token ids must be uint8 (1), uint16 (8) or int32 (4)", code));
    }
    const auto sequences = at<uint64_t>(p + 18), documents = at<uint64_t>(p + 26);
    // The arrays' sizes first, so a header that lies is caught before any
    // read past the end (and counts that would overflow are refused).
    const uint64_t limit = static_cast<uint64_t>(size);
    if (sequences > limit / 12 || documents > limit / 8 ||
        kFixedBytes + 12 * sequences + 8 * documents != limit) {
      throw InputError(idx, "sequence and document counts",
                       strprintf("say %llu sequences and %llu document entries, so %llu bytes, "
                                 "but the index has %lld",
                                 static_cast<unsigned long long>(sequences),
                                 static_cast<unsigned long long>(documents),
                                 static_cast<unsigned long long>(kFixedBytes + 12 * sequences + 8 * documents),
                                 static_cast<long long>(size)));
    }
    const char* sizes = p + kFixedBytes;
    const char* pointers = sizes + 4 * sequences;
    const char* docs = pointers + 8 * sequences;
    int64_t offset = 0;
    for (uint64_t i = 0; i < sequences; ++i) {
      const auto n = at<int32_t>(sizes + 4 * i);
      const auto ptr = at<int64_t>(pointers + 8 * i);
      if (n < 0 || ptr != offset) {
        throw InputError(idx, strprintf("sequence %llu", static_cast<unsigned long long>(i)),
                         n < 0 ? "negative length"
                               : strprintf("starts at byte %lld of the .bin, expected %lld (the "
                                           "sequences are read back to back)",
                                           static_cast<long long>(ptr), static_cast<long long>(offset)));
      }
      offset += static_cast<int64_t>(n) * static_cast<int64_t>(elem_);
    }
    int64_t prev = 0;
    for (uint64_t d = 0; d < documents; ++d) {
      const auto first = at<int64_t>(docs + 8 * d);
      const bool ok = d == 0 ? first == 0 : first >= prev && first <= static_cast<int64_t>(sequences);
      if (!ok) {
        throw InputError(idx, strprintf("document index %llu", static_cast<unsigned long long>(d)),
                         strprintf("%lld is out of order (0 first, increasing, at most %llu)",
                                   static_cast<long long>(first), static_cast<unsigned long long>(sequences)));
      }
      prev = first;
    }
    if (documents == 0 || prev != static_cast<int64_t>(sequences)) {
      throw InputError(idx, "document index", "must end with the sequence count");
    }
    documents_ = static_cast<int64_t>(documents) - 1;
    if (bin_.size() != offset) {
      throw InputError(bin, "size",
                       strprintf("%lld bytes, the index describes %lld%s", static_cast<long long>(bin_.size()),
                                 static_cast<long long>(offset), bin_.size() < offset ? " (truncated)" : ""));
    }
    count_ = offset / static_cast<int64_t>(elem_);
  }
  int64_t num_tokens() const override { return count_; }
  int64_t num_documents() const override { return documents_; }
  // Document d's first token: its first sequence's byte offset (the index
  // was checked when opened).
  int64_t document_start(int64_t d) const {
    const char* p = idx_.data();
    const auto sequences = at<uint64_t>(p + 18);
    const char* pointers = p + kFixedBytes + 4 * sequences;
    const char* docs = pointers + 8 * sequences;
    const auto seq = at<int64_t>(docs + 8 * d);
    if (seq >= static_cast<int64_t>(sequences)) return count_;
    return at<int64_t>(pointers + 8 * seq) / static_cast<int64_t>(elem_);
  }
  void document_starts(int64_t first, int64_t count, const int32_t*,
                       std::vector<int64_t>* out) const override {
    starts_inside(documents_, [this](int64_t d) { return document_start(d); }, first, count, out);
  }
  void read(int64_t first, int64_t count, int32_t* out) const override {
    const char* p = bin_.data() + first * static_cast<int64_t>(elem_);
    for (int64_t i = 0; i < count; ++i, p += elem_) {
      // An int32 id at or past 2^31 reads negative and fails the range check.
      out[i] = elem_ == 1 ? static_cast<int32_t>(static_cast<uint8_t>(*p))
               : elem_ == 2 ? static_cast<int32_t>(at<uint16_t>(p))
                            : at<int32_t>(p);
    }
  }
  std::string format() const override {
    return strprintf("Megatron indexed (%s, %lld document%s)",
                     elem_ == 1 ? "uint8" : elem_ == 2 ? "uint16" : "int32",
                     static_cast<long long>(documents_), documents_ == 1 ? "" : "s");
  }
  size_t element_bytes() const { return elem_; }

 private:
  MappedFile idx_, bin_;
  size_t elem_ = 0;
  int64_t count_ = 0, documents_ = 0;
};

}  // namespace

bool is_megatron_dataset(const std::string& path, std::string* bin) {
  const std::string stem = stem_of(path);
  if (stem == path) return false;
  // A .bin beside an .idx is Megatron's (an llm.c shard has no .idx): a
  // damaged index is then reported as such, not as a bad llm.c header.
  struct stat st {};
  if (path.compare(path.size() - 4, 4, ".idx") != 0 && ::stat((stem + ".idx").c_str(), &st) != 0)
    return false;
  *bin = stem + ".bin";
  return true;
}

std::unique_ptr<TokenSource> open_megatron_dataset(const std::string& bin, int64_t* vocab,
                                                   std::string* tokenizer) {
  auto src = std::make_unique<MegatronTokenSource>(bin, stem_of(bin) + ".idx");
  const bool bytes = src->element_bytes() == 1;
  *vocab = bytes ? 256 : 50257;
  *tokenizer = bytes ? "byte" : "gpt2";
  return src;
}

void write_megatron_dataset(const std::string& path, const std::vector<uint32_t>& tokens,
                            const std::vector<int64_t>& doc_starts, int64_t vocab_size) {
  const std::string stem = stem_of(path);
  const uint8_t code = vocab_size <= 256 ? 1 : vocab_size <= 65536 ? 8 : 4;
  const size_t elem = code_bytes(code);
  std::string data(tokens.size() * elem, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) std::memcpy(&data[i * elem], &tokens[i], elem);
  std::string idx(kMagic, 9);
  const auto put = [&idx](const auto v) { idx.append(reinterpret_cast<const char*>(&v), sizeof v); };
  const auto docs = static_cast<uint64_t>(doc_starts.size());
  put(uint64_t{1});
  put(code);
  put(docs);      // one sequence per document
  put(docs + 1);  // the document index and its end
  for (size_t d = 0; d < doc_starts.size(); ++d) {
    const int64_t end = d + 1 < doc_starts.size() ? doc_starts[d + 1] : static_cast<int64_t>(tokens.size());
    put(static_cast<int32_t>(end - doc_starts[d]));
  }
  for (int64_t start : doc_starts) put(static_cast<int64_t>(start * static_cast<int64_t>(elem)));
  for (uint64_t d = 0; d <= docs; ++d) put(static_cast<int64_t>(d));
  write_file_durably(stem + ".bin", data);
  write_file_durably(stem + ".idx", idx);
}

}  // namespace mpiformer
