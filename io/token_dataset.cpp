#include "token_dataset.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <xxhash.h>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/output_file.hpp"
#include "core/format.hpp"
#include "hdf5_attributes.hpp"
#include "hdf5_handle.hpp"
#include "hdf5_precheck.hpp"
#include "mapped_file.hpp"
#include "megatron_dataset.hpp"
#include "token_source.hpp"

namespace mpiformer {

namespace {

constexpr int32_t kBinMagic = 20240520;
constexpr int64_t kBinHeaderInts = 256;
constexpr int64_t kScanChunk = 1 << 20;
constexpr int32_t kGpt2EndOfText = 50256;

// Throws unless out[0..n) are ids below vocab; `first` is out[0]'s index in
// the file, for the message.
void check_ids(const int32_t* out, int64_t n, int64_t first, int64_t vocab,
               const std::string& path) {
  for (int64_t i = 0; i < n; ++i) {
    if (out[i] < 0 || out[i] >= vocab) {
      throw InputError(path, "token " + std::to_string(first + i),
                       strprintf("id %lld is not below vocab_size %lld",
                                 static_cast<long long>(static_cast<uint32_t>(out[i])),
                                 static_cast<long long>(vocab)));
    }
  }
}

// Rows [first, first + n) of a 1-D dataset, as `memtype`, into out.
void read_rows(hid_t dset, hid_t memtype, int64_t first, int64_t n, void* out,
               const std::string& path, const char* name) {
  H5Handle fspace(H5Dget_space(dset), H5Sclose);
  const hsize_t start[1] = {static_cast<hsize_t>(first)}, count[1] = {static_cast<hsize_t>(n)};
  H5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path);
  H5Handle mspace(H5Screate_simple(1, count, nullptr), H5Sclose);
  if (H5Dread(dset, memtype, mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0) {
    throw InputError(path, name, "read failed (damaged or truncated file?)");
  }
}

// llm.c shard: mapped read-only; the page cache does the buffering.
class BinTokenSource final : public TokenSource {
 public:
  explicit BinTokenSource(const std::string& path) : TokenSource(path), file_(path, "llm.c shard") {
    const int64_t header_bytes = kBinHeaderInts * 4, size = file_.size();
    if (size < header_bytes) {
      throw InputError(path, "header",
                       strprintf("truncated: %lld bytes, an llm.c header alone is %lld",
                                 static_cast<long long>(size), static_cast<long long>(header_bytes)));
    }
    const auto* header = reinterpret_cast<const int32_t*>(file_.data());
    if (header[0] != kBinMagic) {
      throw InputError(path, "header magic",
                       strprintf("expected %d (llm.c token shard), got %d", kBinMagic, header[0]));
    }
    if (header[1] != 1) {
      throw InputError(path, "header version",
                       strprintf("expected 1 (GPT-2 uint16 tokens), got %d", header[1]));
    }
    count_ = header[2];
    const int64_t expect = header_bytes + 2 * count_;
    if (count_ < 0 || size != expect) {
      throw InputError(path, "header token count",
                       strprintf("says %lld tokens, so %lld bytes, but the file has %lld bytes%s",
                                 static_cast<long long>(count_), static_cast<long long>(expect),
                                 static_cast<long long>(size), size < expect ? " (truncated)" : ""));
    }
    tokens_ = reinterpret_cast<const uint16_t*>(file_.data() + header_bytes);
  }
  int64_t num_tokens() const override { return count_; }
  void read(int64_t first, int64_t count, int32_t* out) const override {
    for (int64_t i = 0; i < count; ++i) out[i] = tokens_[first + i];
  }
  std::string format() const override { return "llm.c .bin (uint16)"; }

 private:
  MappedFile file_;
  int64_t count_ = 0;
  const uint16_t* tokens_ = nullptr;
};

class H5TokenSource final : public TokenSource {
 public:
  H5TokenSource(const std::string& path, int64_t* vocab, std::string* tokenizer)
      : TokenSource(path) {
    precheck_hdf5(path);
    H5QuietErrors quiet;
    file_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file_.valid()) throw InputError(path, "", "cannot open as HDF5 (damaged or truncated?)");
    if (H5Lexists(file_.get(), "tokens", H5P_DEFAULT) <= 0) {
      throw InputError(path, "/tokens", "missing (a token dataset holds a 1-D dataset /tokens)");
    }
    dset_ = open_own_dataset(file_.get(), path, "/tokens");
    H5Handle type(H5Dget_type(dset_.get()), H5Tclose);
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_sign(type.get()) != H5T_SGN_NONE ||
        H5Tget_size(type.get()) > 4) {
      throw InputError(path, "/tokens", "expected unsigned integers of at most 32 bits");
    }
    H5Handle space(H5Dget_space(dset_.get()), H5Sclose);
    if (H5Sget_simple_extent_ndims(space.get()) != 1) {
      throw InputError(path, "/tokens", "expected a 1-D dataset");
    }
    hsize_t dims[1] = {0};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    require_stored(dset_.get(), path, "/tokens");
    count_ = static_cast<int64_t>(dims[0]);
    *vocab = read_int_attr(file_.get(), "vocab_size", path_);
    *tokenizer = read_string_attr(file_.get(), "tokenizer", path_);
    // Written by prep: the whole file's range checked in O(1). Files from
    // elsewhere are checked a window at a time as they are read.
    if (has_attr(file_.get(), "max_token_id")) {
      const int64_t max_id = read_int_attr(file_.get(), "max_token_id", path_);
      if (max_id >= *vocab) {
        throw InputError(path, "attribute max_token_id",
                         strprintf("%lld is not below vocab_size %lld",
                                   static_cast<long long>(max_id), static_cast<long long>(*vocab)));
      }
    }
    open_documents();
  }
  int64_t num_tokens() const override { return count_; }
  int64_t num_documents() const override { return docs_.valid() ? documents_ : -1; }
  void document_starts(int64_t first, int64_t count, const int32_t* tokens,
                       std::vector<int64_t>* out) const override {
    if (!docs_.valid()) {
      TokenSource::document_starts(first, count, tokens, out);
      return;
    }
    // A read per probe (the offsets were checked when opened).
    starts_inside(documents_, [this](int64_t k) { return offset_at(k); }, first, count, out);
  }
  void read(int64_t first, int64_t count, int32_t* out) const override {
    // Stored unsigned; read as uint32 (HDF5 converts) into int32 storage:
    // an id of 2^31 or more reads negative and fails the range check.
    read_rows(dset_.get(), H5T_NATIVE_UINT32, first, count, out, path_, "/tokens");
  }
  std::string format() const override {
    return docs_.valid() ? strprintf("HDF5, %lld documents", static_cast<long long>(documents_))
                         : "HDF5";
  }

 private:
  // /documents: each document's first token, 0 first, increasing, below
  // the token count.
  void open_documents() {
    if (H5Lexists(file_.get(), "documents", H5P_DEFAULT) <= 0) return;
    docs_ = open_own_dataset(file_.get(), path_, "/documents");
    H5Handle type(H5Dget_type(docs_.get()), H5Tclose);
    H5Handle space(H5Dget_space(docs_.get()), H5Sclose);
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_ndims(space.get()) != 1) {
      throw InputError(path_, "/documents", "expected a 1-D dataset of integers (document offsets)");
    }
    hsize_t dims[1] = {0};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    require_stored(docs_.get(), path_, "/documents");
    documents_ = static_cast<int64_t>(dims[0]);
    if (documents_ > count_ || (count_ > 0 && documents_ == 0)) {
      throw InputError(path_, "/documents",
                       strprintf("%lld documents for %lld tokens: expected 1 to %lld (every "
                                 "document holds a token)",
                                 static_cast<long long>(documents_), static_cast<long long>(count_),
                                 static_cast<long long>(count_)));
    }
    // Every offset, a chunk at a time (as a Megatron index is checked:
    // linear in the documents, not the tokens, in constant memory), so a
    // damaged record is refused when the run starts, on every rank.
    constexpr int64_t kChunk = 1 << 20;
    std::vector<int64_t> chunk;
    int64_t before = -1;
    for (int64_t k0 = 0; k0 < documents_; k0 += kChunk) {
      const int64_t n = std::min(kChunk, documents_ - k0);
      chunk.resize(static_cast<size_t>(n));
      read_offsets(k0, n, chunk.data());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = k0 + i, at = chunk[static_cast<size_t>(i)];
        const std::string field = strprintf("/documents[%lld]", static_cast<long long>(k));
        if (k == 0 && at != 0) {
          throw InputError(path_, field,
                           strprintf("%lld: the first document starts at token 0",
                                     static_cast<long long>(at)));
        }
        if (at < 0 || at >= count_) {
          throw InputError(path_, field,
                           strprintf("%lld points past the %lld tokens", static_cast<long long>(at),
                                     static_cast<long long>(count_)));
        }
        if (at <= before) {
          throw InputError(path_, field,
                           strprintf("%lld is not above the offset before it (%lld): document "
                                     "offsets increase",
                                     static_cast<long long>(at), static_cast<long long>(before)));
        }
        before = at;
      }
    }
  }
  // /documents[k0, k0 + n) as signed 64-bit integers (an offset of 2^63 or
  // more reads negative and is refused).
  void read_offsets(int64_t k0, int64_t n, int64_t* out) const {
    read_rows(docs_.get(), H5T_NATIVE_INT64, k0, n, out, path_, "/documents");
  }
  int64_t offset_at(int64_t k) const {
    int64_t v = 0;
    read_offsets(k, 1, &v);
    return v;
  }

  H5Handle file_, dset_, docs_;
  int64_t count_ = 0, documents_ = 0;
};

bool looks_like_hdf5(const std::string& path) {
  H5QuietErrors quiet;
  return H5Fis_hdf5(path.c_str()) > 0;
}

std::vector<std::string> expand(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (paths.empty()) throw InputError(pattern, "", "no such file (nothing matches this path)");
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

TokenDataset::TokenDataset(const std::string& path_or_glob, const DataLabel& given)
    : path_(path_or_glob) {
  for (const auto& p : expand(path_or_glob)) {
    // Before reading a byte: a FIFO would block forever, a device never end.
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      throw InputError(p, "", std::string("cannot open: ") + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
      throw InputError(p, "", S_ISDIR(st.st_mode) ? "a directory, not a token dataset"
                                                  : "not a regular file (a FIFO or a device?): "
                                                    "a token dataset is a file");
    }
    int32_t magic = 0;
    std::ifstream(p, std::ios::binary).read(reinterpret_cast<char*>(&magic), sizeof magic);
    int64_t vocab = 0;
    std::string tokenizer;
    std::unique_ptr<TokenSource> src;
    const bool bin_name = p.size() > 4 && p.compare(p.size() - 4, 4, ".bin") == 0;
    std::string megatron_bin;
    bool labelled = false;  // HDF5 datasets carry vocab_size and tokenizer
    if (magic != kBinMagic && is_megatron_dataset(p, &megatron_bin)) {
      src = open_megatron_dataset(megatron_bin, &vocab, &tokenizer);
    } else if (magic == kBinMagic || (bin_name && !looks_like_hdf5(p))) {
      src = std::make_unique<BinTokenSource>(p);
      vocab = 50257;  // version 1 shards hold GPT-2 tokens
      tokenizer = "gpt2";
    } else if (looks_like_hdf5(p)) {
      src = std::make_unique<H5TokenSource>(p, &vocab, &tokenizer);
      labelled = true;
    } else {
      throw InputError(p, "", "not a token dataset: neither HDF5, an llm.c .bin shard (magic "
                              "20240520) nor a Megatron .bin/.idx pair");
    }
    // A file without a label takes the deck's; one with a label must agree.
    if (!labelled) {
      if (given.vocab_size > 0) vocab = given.vocab_size;
      if (!given.tokenizer.empty()) tokenizer = given.tokenizer;
    } else if (given.vocab_size > 0 && given.vocab_size != vocab) {
      throw InputError(p, "[data] vocab_size",
                       strprintf("%lld, but the file's vocab_size attribute is %lld",
                                 static_cast<long long>(given.vocab_size), static_cast<long long>(vocab)));
    } else if (!given.tokenizer.empty() && given.tokenizer != tokenizer) {
      throw InputError(p, "[data] tokenizer",
                       "\"" + given.tokenizer + "\", but the file's tokenizer attribute is \"" +
                           tokenizer + "\"");
    }
    if (vocab < 1 || vocab > (1 << 24)) {
      throw InputError(p, "attribute vocab_size",
                       strprintf("expected 1..%d, got %lld", 1 << 24, static_cast<long long>(vocab)));
    }
    if (!files_.empty() && (vocab != vocab_size_ || tokenizer != tokenizer_)) {
      throw InputError(p, "vocab_size/tokenizer", "differs from the first file of " + path_or_glob);
    }
    vocab_size_ = vocab;
    tokenizer_ = tokenizer;
    // Where a file records no documents: GPT-2's pipelines (prep's, llm.c's)
    // put <|endoftext|> before each one.
    if (tokenizer == "gpt2") src->set_separator(kGpt2EndOfText);
    files_.push_back(std::move(src));
  }
}

TokenDataset::~TokenDataset() = default;
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;

int64_t TokenDataset::num_tokens() const {
  int64_t n = 0;
  for (const auto& f : files_) n += f->num_tokens();
  return n;
}

std::string TokenDataset::format() const {
  return files_.front()->format() +
         (files_.size() > 1 ? strprintf(", %zu files", files_.size()) : "");
}

int64_t TokenDataset::num_windows(int64_t seq_len) const {
  int64_t n = 0;
  for (const auto& f : files_) n += std::max<int64_t>(0, (f->num_tokens() - 1) / seq_len);
  return n;
}

void TokenDataset::read_window(int64_t index, int64_t seq_len, int32_t* out) const {
  for (const auto& f : files_) {
    const int64_t w = std::max<int64_t>(0, (f->num_tokens() - 1) / seq_len);
    if (index < w) {
      f->read(index * seq_len, seq_len + 1, out);
      check_ids(out, seq_len + 1, index * seq_len, vocab_size_, f->path());
      return;
    }
    index -= w;
  }
  throw std::out_of_range("TokenDataset::read_window: window index past the end");
}

void TokenDataset::window_document_starts(int64_t index, int64_t seq_len, const int32_t* tokens,
                                          std::vector<int32_t>* starts) const {
  starts->clear();
  for (const auto& f : files_) {
    const int64_t w = std::max<int64_t>(0, (f->num_tokens() - 1) / seq_len);
    if (index < w) {
      // Per thread, kept: no allocation per window read in a step.
      thread_local std::vector<int64_t> at;
      at.clear();
      f->document_starts(index * seq_len, seq_len, tokens, &at);
      for (const int64_t a : at) starts->push_back(static_cast<int32_t>(a - index * seq_len));
      return;
    }
    index -= w;
  }
  throw std::out_of_range("TokenDataset::window_document_starts: window index past the end");
}

int64_t TokenDataset::num_documents() const {
  int64_t n = 0;
  for (const auto& f : files_) {
    if (f->num_documents() < 0) return -1;
    n += f->num_documents();
  }
  return n;
}

std::string TokenDataset::document_source() const {
  const auto& f = *files_.front();
  if (f.num_documents() >= 0) return "recorded";
  if (f.separator() >= 0) return strprintf("token %d starts each", f.separator());
  return "none";
}

void TokenDataset::read_tokens(int64_t first, int64_t count, int32_t* out) const {
  for (const auto& f : files_) {
    if (count == 0) return;
    if (first < f->num_tokens()) {
      const int64_t n = std::min(count, f->num_tokens() - first);
      f->read(first, n, out);
      check_ids(out, n, first, vocab_size_, f->path());
      out += n;
      count -= n;
      first = 0;
    } else {
      first -= f->num_tokens();
    }
  }
}

std::string TokenDataset::fingerprint() const {
  constexpr int64_t kEnd = 4096;
  std::string text;
  std::vector<char> bytes(2 * kEnd);
  for (const auto& f : files_) {
    std::ifstream in(f->path(), std::ios::binary | std::ios::ate);
    const int64_t size = in ? static_cast<int64_t>(in.tellg()) : -1;
    if (size < 0) throw InputError(f->path(), "", "cannot be read again (removed or changed?)");
    const int64_t head = std::min(size, kEnd), tail = std::min(size - head, kEnd);
    in.seekg(0);
    in.read(bytes.data(), head);
    in.seekg(size - tail);
    in.read(bytes.data() + head, tail);
    if (!in) throw InputError(f->path(), "", "cannot be read again (removed or changed?)");
    text += strprintf("%s|%lld|%lld|%016llx\n", f->format().c_str(),
                      static_cast<long long>(f->num_tokens()), static_cast<long long>(size),
                      static_cast<unsigned long long>(XXH64(bytes.data(), head + tail, 0)));
  }
  return strprintf("%016llx", static_cast<unsigned long long>(XXH64(text.data(), text.size(), 0)));
}

int64_t TokenDataset::verify_token_range() const {
  constexpr int64_t kChunk = 1 << 20;
  int64_t max_id = -1;
  std::vector<int32_t> buf;
  for (const auto& f : files_) {
    buf.resize(static_cast<size_t>(std::min(f->num_tokens(), kChunk)));
    for (int64_t first = 0; first < f->num_tokens(); first += kChunk) {
      const int64_t n = std::min(kChunk, f->num_tokens() - first);
      f->read(first, n, buf.data());
      check_ids(buf.data(), n, first, vocab_size_, f->path());
      max_id = std::max<int64_t>(max_id, *std::max_element(buf.begin(), buf.begin() + n));
    }
  }
  return max_id;
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens,
                      int64_t vocab_size, const std::string& tokenizer,
                      const std::vector<int64_t>& documents) {
  const std::string tmp = path + ".tmp";
  try {
    H5QuietErrors quiet;
    H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    use_checksummed_format(fapl.get(), path);
    // Afresh: a link planted at the .tmp's name is removed, never followed.
    ::close(open_output(tmp, OutputMode::kReplace, "--output"));
    H5Handle file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!file.valid()) throw InputError(path, "", "cannot create (is the directory writable?)");
    // The narrowest unsigned type that holds every id halves or quarters the file.
    const hid_t stored = vocab_size <= 256 ? H5T_STD_U8LE
                         : vocab_size <= 65536 ? H5T_STD_U16LE
                                               : H5T_STD_U32LE;
    const hsize_t dims[1] = {tokens.size()};
    H5Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    H5Handle dset(H5Dcreate2(file.get(), "tokens", stored, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT),
                  H5Dclose);
    H5_CHECK(dset.get(), path);
    H5_CHECK(H5Dwrite(dset.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tokens.data()),
             path);
    if (!documents.empty()) {
      const hsize_t ddims[1] = {documents.size()};
      H5Handle dspace(H5Screate_simple(1, ddims, nullptr), H5Sclose);
      H5Handle docs(H5Dcreate2(file.get(), "documents", H5T_STD_I64LE, dspace.get(), H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
                    H5Dclose);
      H5_CHECK(docs.get(), path);
      H5_CHECK(H5Dwrite(docs.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        documents.data()),
               path);
    }
    write_int_attr(file.get(), "vocab_size", vocab_size, path);
    write_string_attr(file.get(), "tokenizer", tokenizer, path);
    const auto max_id = std::max_element(tokens.begin(), tokens.end());
    // -1 for no tokens (as int64: the uint32 -1 would read as 2^32 - 1).
    write_int_attr(file.get(), "max_token_id",
                   max_id == tokens.end() ? int64_t{-1} : static_cast<int64_t>(*max_id), path);
    H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), path);
  } catch (const std::exception&) {
    std::remove(tmp.c_str());  // a full disk: nothing partial stays behind
    throw;
  }
  try {
    durable_rename(tmp, path);
  } catch (const SystemError& e) {
    std::remove(tmp.c_str());
    throw InputError(path, "", std::string("cannot put the finished file in place: ") + e.what());
  }
}

}  // namespace mpiformer
