#include "text_stream.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/format.hpp"
#include "core/input_file.hpp"

namespace mpiformer {

namespace {

constexpr size_t kInput = size_t{1} << 20;  // compressed bytes read at a time

class FileDescriptor {
 public:
  explicit FileDescriptor(const std::string& path) : path_(path) {
    require_regular_file(path, "", "a text file");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw InputError(path, "", std::string("cannot open: ") + std::strerror(errno));
  }
  ~FileDescriptor() { ::close(fd_); }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  // Up to n bytes at `at` (pread: no shared position).
  size_t read_at(char* out, size_t n, int64_t at) const {
    for (;;) {
      const ssize_t got = ::pread(fd_, out, n, at);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) throw InputError(path_, "", std::string("read failed: ") + std::strerror(errno));
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

class PlainText final : public TextStream {
 public:
  PlainText(const std::string& path, int64_t begin, int64_t end)
      : file_(path), at_(begin), end_(end) {}
  size_t read(char* out, size_t n) override {
    if (end_ >= 0) n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(n), end_ - at_));
    if (n == 0) return 0;
    const size_t got = file_.read_at(out, n, at_);
    at_ += static_cast<int64_t>(got);
    return got;
  }

 private:
  FileDescriptor file_;
  int64_t at_, end_;
};

// Compressed input: `input_` holds what was read and not yet decompressed.
class CompressedText : public TextStream {
 protected:
  explicit CompressedText(const std::string& path) : file_(path), input_(kInput) {}
  // More compressed bytes into input_ (the unconsumed ones kept first);
  // false at the file's end.
  bool refill(size_t unconsumed, const char* from) {
    std::memmove(input_.data(), from, unconsumed);
    const size_t got = file_.read_at(input_.data() + unconsumed, input_.size() - unconsumed, at_);
    at_ += static_cast<int64_t>(got);
    have_ = unconsumed + got;
    return got > 0;
  }
  [[noreturn]] void damaged(const std::string& what) const {
    throw InputError(file_.path(), "", what + " (a cut or damaged compressed file?)");
  }
  FileDescriptor file_;
  std::vector<char> input_;
  size_t have_ = 0;
  int64_t at_ = 0;
};

class GzipText final : public CompressedText {
 public:
  explicit GzipText(const std::string& path) : CompressedText(path) {
    std::memset(&z_, 0, sizeof z_);
    // 15 + 32: zlib or gzip headers, found from the data.
    if (inflateInit2(&z_, 15 + 32) != Z_OK) throw SystemError("inflateInit2 failed");
  }
  ~GzipText() override { inflateEnd(&z_); }
  size_t read(char* out, size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(n);
    while (z_.avail_out == n && !done_) {
      if (z_.avail_in == 0) {
        if (!refill(0, input_.data())) {
          if (in_member_) damaged("gzip data ends inside a member");
          done_ = true;
          break;
        }
        z_.next_in = reinterpret_cast<Bytef*>(input_.data());
        z_.avail_in = static_cast<uInt>(have_);
      }
      in_member_ = true;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        in_member_ = false;
        inflateReset(&z_);  // a next member (concatenated gzip files) may follow
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        damaged(std::string("gzip data is damaged: ") + (z_.msg != nullptr ? z_.msg : "inflate failed"));
      }
    }
    return n - z_.avail_out;
  }

 private:
  z_stream z_;
  bool in_member_ = false, done_ = false;
};

class ZstdText final : public CompressedText {
 public:
  explicit ZstdText(const std::string& path) : CompressedText(path), d_(ZSTD_createDStream()) {
    if (d_ == nullptr) throw SystemError("ZSTD_createDStream failed");
  }
  ~ZstdText() override { ZSTD_freeDStream(d_); }
  size_t read(char* out, size_t n) override {
    ZSTD_outBuffer o{out, n, 0};
    while (o.pos == 0 && !done_) {
      if (in_.pos == in_.size) {
        if (!refill(0, input_.data())) {
          if (in_frame_) damaged("zstd data ends inside a frame");
          done_ = true;
          break;
        }
        in_ = ZSTD_inBuffer{input_.data(), have_, 0};
      }
      const size_t rc = ZSTD_decompressStream(d_, &o, &in_);
      if (ZSTD_isError(rc)) damaged(std::string("zstd data is damaged: ") + ZSTD_getErrorName(rc));
      in_frame_ = rc != 0;  // 0: a frame just ended
    }
    return o.pos;
  }

 private:
  ZSTD_DStream* d_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool in_frame_ = false, done_ = false;
};

}  // namespace

Compression compression_of(const std::string& path) {
  const FileDescriptor f(path);
  unsigned char magic[4] = {0, 0, 0, 0};
  const size_t got = f.read_at(reinterpret_cast<char*>(magic), 4, 0);
  if (got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) return Compression::kGzip;
  if (got == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd)
    return Compression::kZstd;
  return Compression::kNone;
}

std::unique_ptr<TextStream> open_text(const std::string& path, int64_t begin, int64_t end) {
  switch (compression_of(path)) {
    case Compression::kGzip: return std::make_unique<GzipText>(path);
    case Compression::kZstd: return std::make_unique<ZstdText>(path);
    case Compression::kNone: break;
  }
  return std::make_unique<PlainText>(path, begin, end);
}

}  // namespace mpiformer
