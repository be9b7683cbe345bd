// What can be checked of an HDF5 file before the HDF5 library parses it:
// the superblock's signature and version, its field sizes, and that the
// file is as long as the superblock says (a truncated copy, a file cut by a
// full disk). Damage deeper inside (object headers, B-trees, heaps) is
// HDF5's to find, and a crafted or badly damaged file can still crash the
// library itself (1.10's parser trusts much of what it reads); checkpoints
// add a checksum per tensor and over the root metadata, which HDF5 reads
// before mpiformer checks them.
#pragma once
#include <string>

namespace mpiformer {

// Throws InputError(path, "HDF5 superblock", why) unless `path` starts (at
// offset 0 or a power of two from 512) with a plausible superblock whose
// end-of-file address is within the file.
void precheck_hdf5(const std::string& path);

}  // namespace mpiformer
