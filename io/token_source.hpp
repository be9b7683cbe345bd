// One file of a token dataset (token_dataset.hpp), whatever its format:
// the formats' readers implement it. Internal to io.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mpiformer {

class TokenSource {
 public:
  explicit TokenSource(std::string path) : path_(std::move(path)) {}
  virtual ~TokenSource() = default;
  const std::string& path() const { return path_; }
  virtual int64_t num_tokens() const = 0;
  virtual void read(int64_t first, int64_t count, int32_t* out) const = 0;
  virtual std::string format() const = 0;
  // The documents' starts among tokens (first, first + count) of this file,
  // increasing, appended to `out` as file indices; `tokens` are tokens
  // [first, first + count). Files that record their documents (HDF5's
  // /documents, a Megatron index) say so; others fall back to a token that
  // starts every document (GPT-2's <|endoftext|>, set_separator), if any.
  virtual void document_starts(int64_t first, int64_t count, const int32_t* tokens,
                               std::vector<int64_t>* out) const {
    if (separator_ < 0) return;
    for (int64_t i = 1; i < count; ++i)
      if (tokens[i] == separator_) out->push_back(first + i);
  }
  // Documents the file records; -1 where it records none.
  virtual int64_t num_documents() const { return -1; }
  void set_separator(int32_t id) { separator_ = id; }
  int32_t separator() const { return separator_; }

 protected:
  std::string path_;
  int32_t separator_ = -1;
};

// The starts in (first, first + count) among n non-decreasing document
// starts start(k), appended once each to `out`: a binary search for the
// first past `first`, then in order while inside (a repeated start, an
// empty document's, is one).
template <class Start>
void starts_inside(int64_t n, const Start& start, int64_t first, int64_t count,
                   std::vector<int64_t>* out) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (start(mid) <= first) lo = mid + 1;
    else hi = mid;
  }
  for (int64_t k = lo; k < n; ++k) {
    const int64_t at = start(k);
    if (at >= first + count) break;
    if (out->empty() || out->back() != at) out->push_back(at);
  }
}

}  // namespace mpiformer
