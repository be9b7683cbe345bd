#include "hdf5_precheck.hpp"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
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

}  // namespace

void precheck_hdf5(const std::string& path) {
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
  const uint64_t eof = little_endian(sb + eof_at, offsets);
  const uint64_t undefined = offsets == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * offsets)) - 1;
  // The end-of-file address is relative to the base address, which is the
  // superblock's own position in every file HDF5 writes.
  if (eof != undefined && at + eof > size) {
    throw InputError(path, "HDF5 superblock",
                     strprintf("says the file is %llu bytes long, but it has %llu: truncated (an "
                               "interrupted copy or a full disk?)",
                               static_cast<unsigned long long>(at + eof),
                               static_cast<unsigned long long>(size)));
  }
}

}  // namespace mpiformer
