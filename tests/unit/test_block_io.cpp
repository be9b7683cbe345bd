// io/block_io.hpp: runs at every alignment write and read back the bytes
// given, and leave every byte outside them as it was; with O_DIRECT (where
// the temporary directory's file system takes it) and without it (where a
// file system refuses it: every byte through the page cache); and never
// into a file swapped in under the name. The reference is the file read
// whole with an ifstream.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "block_io.hpp"
#include "temp_dir.hpp"

namespace mpiformer::test {
namespace {

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs of several sizes at several offsets (inside one block, across one
// boundary, many blocks with ragged ends, past the 16 MiB staging buffer),
// written into a file of known bytes, then read back.
void check_runs(const std::string& path, bool try_direct, bool want_direct) {
  constexpr int64_t kSize = (int64_t{40} << 20) + 123;
  std::vector<char> file(static_cast<size_t>(kSize));
  std::mt19937 gen(7);
  for (char& c : file) c = static_cast<char>(gen());
  { std::ofstream(path, std::ios::binary).write(file.data(), kSize); }
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  {
    BlockIo io(path, fd, try_direct);
    EXPECT_EQ(io.direct(), want_direct) << path;
    const std::vector<std::pair<int64_t, int64_t>> runs = {
        {0, 4096},           {5, 10},        {4090, 20},     {8192, 3 * 4096},
        {12345, 100000},     {1 << 20, 17},  {(2 << 20) + 1, (17 << 20) + 4095},
        {kSize - 5000, 5000}};
    for (const auto& [at, n] : runs) {
      std::vector<char> data(static_cast<size_t>(n));
      for (char& c : data) c = static_cast<char>(gen());
      ASSERT_TRUE(io.write(data.data(), data.size(), at)) << at << " " << n;
      std::copy(data.begin(), data.end(), file.begin() + at);
    }
    ASSERT_EQ(::fsync(fd), 0);
    for (const auto& [at, n] : runs) {
      std::vector<char> back(static_cast<size_t>(n));
      ASSERT_TRUE(io.read(back.data(), back.size(), at)) << at << " " << n;
      EXPECT_TRUE(std::equal(back.begin(), back.end(), file.begin() + at)) << at << " " << n;
    }
  }
  ::close(fd);
  EXPECT_TRUE(read_all(path) == file) << "bytes outside the runs changed, or the runs were lost";
}

TEST(BlockIo, RunsAtEveryAlignmentBypassingThePageCache) {
  TempDir dir;
  const std::string path = dir.file("blocks");
  // Where the temporary directory's file system refuses O_DIRECT too, the
  // check is the page cache's (said so).
  const int probe = (std::ofstream(path).close(), ::open(path.c_str(), O_RDWR | O_DIRECT));
  const bool direct = probe >= 0;
  if (probe >= 0) ::close(probe);
  if (!direct) std::printf("note: %s refuses O_DIRECT: buffered only\n", path.c_str());
  check_runs(path, true, direct);
}

TEST(BlockIo, EveryByteThroughThePageCacheWithoutODirect) {
  TempDir dir;
  check_runs(dir.file("blocks"), false, false);
}

// Another file renamed over the name between the caller's open and the
// second (O_DIRECT) one: every byte goes to the caller's file, none to the
// one now under the name.
TEST(BlockIo, AFileSwappedInUnderTheNameIsNeverWritten) {
  TempDir dir;
  const std::string path = dir.file("blocks"), other = dir.file("other");
  { std::ofstream(path, std::ios::binary).write(std::string(1 << 16, 'a').data(), 1 << 16); }
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  { std::ofstream(other, std::ios::binary).write(std::string(1 << 16, 'b').data(), 1 << 16); }
  std::filesystem::rename(other, path);  // the caller's file is now nameless
  {
    BlockIo io(path, fd, true);
    EXPECT_FALSE(io.direct());
    const std::string data(3 * 4096, 'c');
    ASSERT_TRUE(io.write(data.data(), data.size(), 4096));
  }
  EXPECT_TRUE(read_all(path) == std::vector<char>(1 << 16, 'b')) << "the file under the name was written";
  std::vector<char> mine(3 * 4096);
  ASSERT_EQ(::pread(fd, mine.data(), mine.size(), 4096), static_cast<ssize_t>(mine.size()));
  EXPECT_TRUE(mine == std::vector<char>(3 * 4096, 'c')) << "the caller's file did not get the bytes";
  ::close(fd);
}

}  // namespace
}  // namespace mpiformer::test
