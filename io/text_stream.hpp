// Text as prep reads it: a plain file (or a byte range of one), or a gzip
// or zstd file decompressed as it is read (whole only: neither format can
// start in the middle). The format is found from the first bytes, not the
// name. Memory: one buffer of compressed input, whatever the file's size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace mpiformer {

enum class Compression { kNone, kGzip, kZstd };

// From the file's magic bytes; InputError naming the file if it cannot be
// read or is not a regular file.
Compression compression_of(const std::string& path);

class TextStream {
 public:
  virtual ~TextStream() = default;
  // Up to n bytes of text into out; 0 at the end. InputError naming the
  // file where the data is damaged (a cut or corrupt compressed stream).
  virtual size_t read(char* out, size_t n) = 0;
};

// Bytes [begin, end) of a plain file (end -1: to its end), or the whole
// text of a compressed one (begin 0, end -1).
std::unique_ptr<TextStream> open_text(const std::string& path, int64_t begin = 0, int64_t end = -1);

}  // namespace mpiformer
