// Token datasets: both formats read back what was written (the .bin shard is
// written here byte by byte, independently of the reader), windows follow
// the stated layout, and each kind of damage is an InputError naming it.
// Opening is O(1) in the size: ids are checked as windows are read.
#include <hdf5.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <functional>

#include "core/error.hpp"
#include "reference.hpp"
#include "temp_dir.hpp"
#include "token_dataset.hpp"

namespace mpiformer::test {
namespace {

std::string write_bin(const TempDir& dir, const std::string& name,
                      const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                      int32_t version = 1, int64_t claimed = -1, size_t drop_bytes = 0) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(claimed < 0 ? static_cast<int64_t>(tokens.size()) : claimed);
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  bytes.resize(bytes.size() - drop_bytes);
  return dir.write(name, bytes);
}

std::string error_of(const std::string& path) {
  try {
    TokenDataset d(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenDataset, Hdf5RoundTripAndWindows) {
  TempDir dir;
  std::vector<uint32_t> tokens(23);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 % 300);
  const std::string path = dir.file("t.h5");
  write_token_file(path, tokens, 300, "test");
  TokenDataset d(path);
  EXPECT_EQ(d.num_tokens(), 23);
  EXPECT_EQ(d.vocab_size(), 300);
  EXPECT_EQ(d.tokenizer(), "test");
  EXPECT_EQ(d.num_windows(5), 4);  // (23 - 1) / 5
  std::vector<int32_t> w(6);
  d.read_window(3, 5, w.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w[i], static_cast<int32_t>(tokens[15 + i]));
}

TEST(TokenDataset, BinShardsByGlobNeverCrossFiles) {
  TempDir dir;
  std::vector<uint16_t> a(11), b(8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(100 + i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(50000 + i);
  write_bin(dir, "shard_000.bin", a);
  write_bin(dir, "shard_001.bin", b);
  TokenDataset d(dir.file("shard_*.bin"));
  EXPECT_EQ(d.num_tokens(), 19);
  EXPECT_EQ(d.vocab_size(), 50257);
  EXPECT_EQ(d.tokenizer(), "gpt2");
  EXPECT_EQ(d.num_windows(4), 2 + 1);  // (11-1)/4 + (8-1)/4
  std::vector<int32_t> w(5);
  d.read_window(2, 4, w.data());  // the first window of the second shard
  for (int i = 0; i < 5; ++i) EXPECT_EQ(w[i], 50000 + i);
}

TEST(TokenDataset, DamageIsNamed) {
  TempDir dir;
  const std::vector<uint16_t> ok(10, 3);
  EXPECT_NE(error_of(write_bin(dir, "magic.bin", ok, 12345)).find("header magic: expected 20240520"),
            std::string::npos);
  EXPECT_NE(error_of(write_bin(dir, "version.bin", ok, 20240520, 7)).find("header version"),
            std::string::npos);
  EXPECT_NE(error_of(write_bin(dir, "trunc.bin", ok, 20240520, 1, -1, 3)).find("truncated"),
            std::string::npos);
  // An id out of range in a shard: found by the read of its window (open
  // reads no tokens), by inspect's full scan, and not by other windows.
  std::vector<uint16_t> big = ok;
  big[4] = 60000;
  const TokenDataset range(write_bin(dir, "range.bin", big));
  std::vector<int32_t> w(4);
  EXPECT_NO_THROW(range.read_window(2, 3, w.data()));  // tokens 6..9
  for (const auto& check : std::vector<std::function<void()>>{
           [&] { range.read_window(1, 3, w.data()); },  // tokens 3..6
           [&] { range.verify_token_range(); }}) {
    try {
      check();
      ADD_FAILURE() << "token 4 = 60000 was not refused";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("range.bin: token 4: id 60000 is not below vocab_size 50257"),
                std::string::npos) << e.what();
    }
  }
  EXPECT_NE(error_of(dir.write("text.txt", "hello")).find("not a token dataset"),
            std::string::npos);
  EXPECT_NE(error_of(dir.file("missing.h5")).find("no such file"), std::string::npos);

  // HDF5: a token above the declared vocabulary, and a truncated file.
  const std::string h5 = dir.file("v.h5");
  write_token_file(h5, {1, 2, 3, 9}, 5, "test");
  EXPECT_NE(error_of(h5).find("attribute max_token_id: 9 is not below vocab_size 5"),
            std::string::npos) << error_of(h5);
  std::vector<uint32_t> many(100000, 1);
  const std::string h5t = dir.file("t.h5");
  write_token_file(h5t, many, 5, "test");
  std::filesystem::resize_file(h5t, std::filesystem::file_size(h5t) / 2);
  EXPECT_NE(error_of(h5t).find(h5t), std::string::npos);
}

// A FIFO (or a device) named like a dataset is refused before it is read:
// reading it would block forever.
TEST(TokenDataset, NonRegularFilesAreRefused) {
  TempDir dir;
  const std::string fifo = dir.file("pipe.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of(fifo).find("pipe.bin: not a regular file"), std::string::npos) << error_of(fifo);
  EXPECT_NE(error_of("/dev/zero").find("not a regular file"), std::string::npos);
  EXPECT_NE(error_of(dir.file("")).find("a directory"), std::string::npos);
}

// A dataset declaring 10^12 tokens (a real pretraining corpus) opens at
// once: the file is sparse (HDF5 allocates no storage until written), and
// a scan at open would read 2 TB of fill values and time the test out.
// A header may declare a trillion tokens in an 8 KB file: storage never
// written would read as HDF5's fill value (0) and train on it. The open
// refuses it at once (the chunk index is counted, no token is read).
TEST(TokenDataset, ATrillionDeclaredTokensWithoutDataAreRefusedAtOnce) {
  TempDir dir;
  const std::string path = dir.file("huge.h5");
  const hsize_t n = 1000000000000ULL, chunk = 1 << 20;
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  const hid_t d = H5Dcreate2(f, "tokens", H5T_STD_U16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  const hid_t scalar = H5Screate(H5S_SCALAR);
  const int64_t vocab = 50257;
  const hid_t a = H5Acreate2(f, "vocab_size", H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &vocab);
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, 4);
  const hid_t ta = H5Acreate2(f, "tokenizer", t, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(ta, t, "gpt2");
  for (hid_t h : {ta, a}) H5Aclose(h);
  H5Tclose(t);
  H5Sclose(scalar);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
  std::string error = "(no error)";
  try {
    const TokenDataset huge(path);
  } catch (const InputError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("huge.h5: /tokens: 0 of its 953675 chunks were written"), std::string::npos)
      << error;
}

}  // namespace
}  // namespace mpiformer::test
