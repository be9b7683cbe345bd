// One file of a token dataset (token_dataset.hpp), whatever its format:
// the formats' readers implement it. Internal to io.
#pragma once
#include <cstdint>
#include <string>

namespace mpiformer {

class TokenSource {
 public:
  explicit TokenSource(std::string path) : path_(std::move(path)) {}
  virtual ~TokenSource() = default;
  const std::string& path() const { return path_; }
  virtual int64_t num_tokens() const = 0;
  virtual void read(int64_t first, int64_t count, int32_t* out) const = 0;
  virtual std::string format() const = 0;

 protected:
  std::string path_;
};

}  // namespace mpiformer
