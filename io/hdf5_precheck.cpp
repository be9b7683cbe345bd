#include "hdf5_precheck.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/format.hpp"

namespace mpiformer {

namespace {

constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

// A little-endian unsigned integer of `size` bytes at p.
uint64_t little_endian(const unsigned char* p, int size) {
  uint64_t v = 0;
  for (int i = size - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct SuperblockEnd {
  uint64_t eof = 0, size = 0;  // the superblock's end-of-file address; the file's size
  bool defined = true;
};

SuperblockEnd superblock_end(const std::string& path) {
  require_regular_file(path, "", "an HDF5 file");
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError(path, "", "cannot read its size: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open");
  // The superblock is at 0 or after a user block of 512, 1024, 2048, ...
  unsigned char sb[128] = {};
  uint64_t at = 0;
  for (bool found = false; !found; at = at == 0 ? 512 : 2 * at) {
    if (at + sizeof kSignature > size) {
      throw InputError(path, "HDF5 superblock", "no HDF5 signature: not an HDF5 file");
    }
    in.seekg(static_cast<std::streamoff>(at));
    in.read(reinterpret_cast<char*>(sb), sizeof sb);
    found = in.gcount() >= 8 && std::memcmp(sb, kSignature, sizeof kSignature) == 0;
    in.clear();
    if (found) break;
  }
  const int version = sb[8];
  int offsets = 0, eof_at = 0;  // size of addresses; where the end-of-file address is
  if (version == 0 || version == 1) {
    offsets = sb[13];
    // signature, 8 one-byte fields, 2 + 2 + 4 bytes, (v1: 4 more), then the
    // base, free-space and end-of-file addresses.
    eof_at = 24 + (version == 1 ? 4 : 0) + 2 * offsets;
  } else if (version == 2 || version == 3) {
    offsets = sb[9];
    eof_at = 12 + 2 * offsets;  // signature, 4 one-byte fields, base, extension
  } else {
    throw InputError(path, "HDF5 superblock",
                     strprintf("version %d, which no HDF5 release writes: damaged", version));
  }
  if (offsets != 2 && offsets != 4 && offsets != 8) {
    throw InputError(path, "HDF5 superblock",
                     strprintf("addresses of %d bytes (2, 4 or 8 expected): damaged", offsets));
  }
  if (static_cast<uint64_t>(eof_at + offsets) > sizeof sb || at + eof_at + offsets > size) {
    throw InputError(path, "HDF5 superblock", "cut short: the file ends inside its superblock");
  }
  SuperblockEnd end;
  end.eof = little_endian(sb + eof_at, offsets);
  end.size = size;
  end.defined = end.eof != (offsets == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * offsets)) - 1);
  return end;
}

}  // namespace

uint64_t hdf5_end_of_file(const std::string& path) { return superblock_end(path).eof; }

void precheck_hdf5(const std::string& path) {
  const SuperblockEnd end = superblock_end(path);
  const uint64_t eof = end.eof, size = end.size;
  // The end-of-file address counts the user block too (HDF5 1.10 writes the
  // whole file's length there, e.g. 8656 for a 512-byte user block and
  // 8144 bytes of HDF5 after it), so it is compared with the file's size.
  if (end.defined && eof > size) {
    throw InputError(path, "HDF5 superblock",
                     strprintf("says the file is %llu bytes long, but it has %llu: truncated (an "
                               "interrupted copy or a full disk?)",
                               static_cast<unsigned long long>(eof),
                               static_cast<unsigned long long>(size)));
  }
}

H5Handle open_own_dataset(hid_t file, const std::string& path, const std::string& name) {
  H5QuietErrors quiet;
  // Each prefix of the path, "/model" then "/model/wte", link by link.
  for (size_t at = name.find('/', 1);; at = name.find('/', at + 1)) {
    const std::string prefix = name.substr(0, at);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) throw InputError(path, name, "missing");
    H5L_info_t info{};
    if (H5Lget_info(file, prefix.c_str(), &info, H5P_DEFAULT) < 0) {
      throw InputError(path, name, "cannot read the link " + prefix);
    }
    if (info.type != H5L_TYPE_HARD) {
      throw InputError(path, name,
                       prefix + " is " +
                           (info.type == H5L_TYPE_EXTERNAL ? "an external link (into another file)"
                                                           : "a soft or user-defined link") +
                           ": this file must hold its own data");
    }
    if (at == std::string::npos) break;
  }
  H5Handle dset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) throw InputError(path, name, "cannot open the dataset");
  H5Handle dcpl(H5Dget_create_plist(dset.get()), H5Pclose);
  if (!dcpl.valid()) throw InputError(path, name, "cannot read the dataset's properties");
  if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) {
    throw InputError(path, name, "a virtual dataset (its data live in other files, and a missing "
                                 "one reads as the fill value): copy the data into the file");
  }
  if (H5Pget_external_count(dcpl.get()) != 0) {
    throw InputError(path, name, "keeps its raw data in external files: copy the data into the file");
  }
  const int filters = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t nvalues = 0;
    char fname[64] = {};
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nvalues, nullptr,
                       sizeof fname, fname, &config);
    if (id < 0 || H5Zfilter_avail(id) <= 0) {
      throw InputError(path, name,
                       strprintf("compressed with filter %d (%s), which this HDF5 cannot decode "
                                 "(h5py's LZF is 32000): rewrite it uncompressed or with gzip",
                                 static_cast<int>(id), fname[0] != 0 ? fname : "unnamed"));
    }
  }
  return dset;
}

void require_stored(hid_t dset, const std::string& path, const std::string& name) {
  H5QuietErrors quiet;
  H5Handle dcpl(H5Dget_create_plist(dset), H5Pclose);
  if (!dcpl.valid()) throw InputError(path, name, "cannot read the dataset's properties");
  H5Handle space(H5Dget_space(dset), H5Sclose);
  H5Handle type(H5Dget_type(dset), H5Tclose);
  const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  if (rank < 0 || !type.valid()) throw InputError(path, name, "cannot read the dataset's shape or type");
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), chunk(static_cast<size_t>(rank), 1);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  const double declared = static_cast<double>(H5Sget_simple_extent_npoints(space.get()));
  if (layout == H5D_CONTIGUOUS) {
    const double stored = static_cast<double>(H5Dget_storage_size(dset));
    if (stored < declared * static_cast<double>(H5Tget_size(type.get()))) {
      throw InputError(path, name, strprintf("declares %.0f values but stores %.0f bytes of them: "
                                             "the rest would read as the fill value",
                                             declared, stored));
    }
  } else if (layout == H5D_CHUNKED && declared > 0) {
    H5Pget_chunk(dcpl.get(), rank, chunk.data());
    double expected = 1;
    for (int i = 0; i < rank; ++i) expected *= std::ceil(static_cast<double>(dims[i]) / static_cast<double>(chunk[i]));
    hsize_t written = 0;
    if (H5Dget_num_chunks(dset, space.get(), &written) < 0 || static_cast<double>(written) < expected) {
      throw InputError(path, name, strprintf("%.0f of its %.0f chunks were written: the rest would "
                                             "read as the fill value",
                                             static_cast<double>(written), expected));
    }
  }
}

}  // namespace mpiformer
