// Attributes of our HDF5 files as other tools write them, and as damage
// leaves them: every string form h5py and the C API produce is read; an
// attribute of the wrong kind or with more than one value is an InputError
// naming the file and the attribute, never a crash. The files are made here
// with HDF5's C API, independently of our writer's choices.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>
#include <vector>

#include "checkpoint.hpp"
#include "core/error.hpp"
#include "temp_dir.hpp"
#include "token_dataset.hpp"

namespace mpiformer::test {
namespace {

// Replaces attribute `name` of `obj` in `path` by what `make` creates.
template <class Make>
void replace_attr(const std::string& path, const char* obj, const char* name, Make make) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
  ASSERT_GE(o, 0);
  if (H5Aexists(o, name) > 0) H5Adelete(o, name);
  make(o);
  H5Oclose(o);
  H5Fclose(f);
}

void string_attr(hid_t o, const char* name, const char* value, bool variable, H5T_cset_t cset) {
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, variable ? H5T_VARIABLE : std::string(value).size());
  H5Tset_cset(t, cset);
  const hid_t s = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(o, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
  if (variable) {
    H5Awrite(a, t, &value);
  } else {
    H5Awrite(a, t, value);
  }
  H5Aclose(a);
  H5Sclose(s);
  H5Tclose(t);
}

// A 1-D attribute of `n` values of `type`.
void array_attr(hid_t o, const char* name, hid_t type, hsize_t n, const void* values) {
  const hid_t s = H5Screate_simple(1, &n, nullptr);
  const hid_t a = H5Acreate2(o, name, type, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, type, values);
  H5Aclose(a);
  H5Sclose(s);
}

std::string token_file(const TempDir& dir) {
  const std::string path = dir.file("t.h5");
  write_token_file(path, std::vector<uint32_t>(100, 7), 256, "byte");
  return path;
}

// A checkpoint of one [2, 3] tensor, /model/x, written by our writer.
void write_small_checkpoint(const std::string& path) {
  const std::vector<float> w(6, 0.5f);
  DatasetSlice d;
  d.name = "/model/x";
  d.shape = {2, 3};
  d.boxes = {DatasetBox{0, 2, 0, 3}};
  d.data = w.data();
  d.reports_checksum = true;
  d.checksum = tensor_checksum(w.data(), 6);
  CheckpointMeta meta;
  meta.tokenizer = "byte";
  write_checkpoint(MPI_COMM_SELF, path, meta, {d});
}

std::string open_error(const std::string& path) {
  try {
    TokenDataset d(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Hdf5Attributes, EveryStringFormOfTheTokenizerIsRead) {
  TempDir dir;
  const std::string path = token_file(dir);
  for (bool variable : {true, false}) {
    for (H5T_cset_t cset : {H5T_CSET_UTF8, H5T_CSET_ASCII}) {
      replace_attr(path, "/", "tokenizer",
                   [&](hid_t o) { string_attr(o, "tokenizer", "byte", variable, cset); });
      const TokenDataset d(path);
      EXPECT_EQ(d.tokenizer(), "byte") << "variable " << variable << ", cset " << cset;
    }
  }
  // Another integer width (h5py writes numpy's int32 or uint16 as given).
  replace_attr(path, "/", "vocab_size", [](hid_t o) {
    const uint16_t v = 256;
    array_attr(o, "vocab_size", H5T_NATIVE_UINT16, 1, &v);
  });
  EXPECT_EQ(TokenDataset(path).vocab_size(), 256);
}

TEST(Hdf5Attributes, WrongKindsAndArraysAreNamedErrors) {
  TempDir dir;
  const std::string path = token_file(dir);
  replace_attr(path, "/", "vocab_size", [](hid_t o) {
    const int64_t v[2] = {256, 512};
    array_attr(o, "vocab_size", H5T_NATIVE_INT64, 2, v);
  });
  std::string e = open_error(path);
  EXPECT_NE(e.find("attribute vocab_size: expected one value"), std::string::npos) << e;
  replace_attr(path, "/", "vocab_size", [](hid_t o) {
    const double v = 256;
    array_attr(o, "vocab_size", H5T_NATIVE_DOUBLE, 1, &v);
  });
  e = open_error(path);
  EXPECT_NE(e.find("attribute vocab_size: expected an integer"), std::string::npos) << e;
  replace_attr(path, "/", "vocab_size", [](hid_t o) {
    const int64_t v = 256;
    array_attr(o, "vocab_size", H5T_NATIVE_INT64, 1, &v);
  });
  replace_attr(path, "/", "tokenizer", [](hid_t o) {
    const char* v[3] = {"byte", "gpt2", "x"};
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    array_attr(o, "tokenizer", t, 3, v);
    H5Tclose(t);
  });
  e = open_error(path);
  EXPECT_NE(e.find("attribute tokenizer: expected one value"), std::string::npos) << e;
  replace_attr(path, "/", "tokenizer", [](hid_t) {});  // deleted
  e = open_error(path);
  EXPECT_NE(e.find("attribute tokenizer: missing"), std::string::npos) << e;
}

TEST(Hdf5Attributes, CheckpointMetadataAndChecksumsOfTheWrongShape) {
  TempDir dir;
  const std::string path = dir.file("c.h5");
  write_small_checkpoint(path);
  {
    const CheckpointReader ok(path);
    EXPECT_EQ(ok.verify("/model/x", {2, 3}), "");
  }
  auto reader_error = [&] {
    try {
      CheckpointReader r(path);
      return r.verify("/model/x", {2, 3});
    } catch (const InputError& e) {
      return std::string(e.what());
    }
  };
  replace_attr(path, "/model/x", "xxh64", [](hid_t o) {
    const uint64_t v[2] = {1, 2};
    array_attr(o, "xxh64", H5T_NATIVE_UINT64, 2, v);
  });
  std::string e = reader_error();
  EXPECT_NE(e.find("expected one value"), std::string::npos) << e;
  replace_attr(path, "/", "step", [](hid_t o) {
    const int64_t v[3] = {1, 2, 3};
    array_attr(o, "step", H5T_NATIVE_INT64, 3, v);
  });
  e = reader_error();
  EXPECT_NE(e.find("attribute step: expected one value"), std::string::npos) << e;
}

// A checkpoint refused after it was opened (a newer format version, root
// attributes that fail their checksum) leaves no HDF5 file open: automatic
// resume then tries older checkpoints in the same process, and a leaked
// handle keeps the refused file open (and its space held) for the run.
TEST(Hdf5Attributes, RefusedCheckpointsLeaveNoFileOpen) {
  TempDir dir;
  const std::string path = dir.file("c.h5");
  write_small_checkpoint(path);
  const auto open_files = [] { return H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE); };
  const ssize_t before = open_files();
  const auto refused = [&](const char* why) {
    EXPECT_THROW(CheckpointReader r(path), InputError) << why;
    EXPECT_EQ(open_files(), before) << why << ": the refused file is still open";
  };
  replace_attr(path, "/", "format_version", [](hid_t o) {
    const int64_t v = 999;
    array_attr(o, "format_version", H5T_NATIVE_INT64, 1, &v);
  });
  refused("a newer format version");
  replace_attr(path, "/", "format_version", [](hid_t o) {
    const int64_t v = kCheckpointFormatVersion;
    array_attr(o, "format_version", H5T_NATIVE_INT64, 1, &v);
  });
  { const CheckpointReader ok(path); }
  EXPECT_EQ(open_files(), before);
  replace_attr(path, "/", "step", [](hid_t o) {
    const int64_t v = 12345;  // not what the root checksum covers
    array_attr(o, "step", H5T_NATIVE_INT64, 1, &v);
  });
  refused("root attributes that fail their checksum");
}

}  // namespace
}  // namespace mpiformer::test
