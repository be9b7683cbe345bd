// Move-only owner of an HDF5 identifier (file, dataset, space, type,
// attribute, property list), closed with the matching H5*close; and a check
// for HDF5 calls that names the call and where it was made.
#pragma once
#include "core/hdf5_check.hpp"
#include <hdf5.h>

#include <string>
#include <utility>

#include "core/error.hpp"

namespace mpiformer {

class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  ~H5Handle() { reset(); }
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership: the identifier is the caller's to close.
  hid_t release() { return std::exchange(id_, -1); }
  void reset() {
    if (id_ >= 0 && close_ != nullptr) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Every file mpiformer writes uses HDF5's 1.8+ file format: its superblock,
// object headers, B-trees and heaps carry checksums that HDF5 verifies on
// reading, so damaged metadata is an error, not input to the parser (which
// trusts the unchecksummed 1.6 structures h5py writes by default). Readable
// by HDF5 1.8 and later (every h5py of the last decade).
inline void use_checksummed_format(hid_t fapl, const std::string& file) {
  H5_CHECK(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST), file);
}

// Group creation properties that keep every link in the group's object
// header (checksummed) rather than in "dense" storage (a fractal heap and a
// B-tree), however many tensors a group holds: libhdf5 1.10's error path
// for damaged dense storage frees memory it never allocated (found by
// tests/e2e/fuzz.sh under AddressSanitizer).
inline H5Handle compact_group_properties(const std::string& file) {
  H5Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5_CHECK(H5Pset_link_phase_change(gcpl.get(), 65535, 65535), file);
  return gcpl;
}

// Silences HDF5's automatic error stack printing for the scope: we report
// failures ourselves, with the file and dataset named.
class H5QuietErrors {
 public:
  H5QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  H5QuietErrors(const H5QuietErrors&) = delete;
  H5QuietErrors& operator=(const H5QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

}  // namespace mpiformer
