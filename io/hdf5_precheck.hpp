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

#include "hdf5_handle.hpp"

namespace mpiformer {

// Throws InputError(path, "HDF5 superblock", why) unless `path` starts (at
// offset 0 or a power of two from 512) with a plausible superblock whose
// end-of-file address is within the file.
void precheck_hdf5(const std::string& path);

// The length the superblock of HDF5 file `path` gives the file (after the
// same checks): what remains of a file that is longer is not HDF5's.
uint64_t hdf5_end_of_file(const std::string& path);

// Opens dataset `name` (an absolute path) of the open `file` at `path` for
// reading, refusing (InputError naming the file and the dataset) what would
// make its data something other than this file's bytes: a link on the way
// that is not a hard link (an external link reads another file, perhaps
// another run's or a FIFO that blocks; a soft link another dataset), a
// virtual dataset (a missing source reads as the fill value), raw data in
// external files, and a filter this HDF5 cannot decode (h5py's LZF), which
// would otherwise fail only when the data are read, mid-run. No link is
// followed before it is checked.
H5Handle open_own_dataset(hid_t file, const std::string& path, const std::string& name);

// Throws InputError naming the file and the dataset unless every value of
// the open dataset is stored: an unallocated dataset, or one with chunks
// never written, reads HDF5's fill value where data are missing (a header
// can declare a trillion tokens in an 8 KB file). Call after the shape is
// checked, so a wrong shape is named as such.
void require_stored(hid_t dset, const std::string& path, const std::string& name);

}  // namespace mpiformer
