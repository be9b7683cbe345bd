// Damages an HDF5 checkpoint for the tests, with the HDF5 library alone (no
// mpiformer code): `delete FILE DATASET` unlinks a dataset; `reshape FILE
// DATASET` replaces it by one with a first dimension one larger; `setint
// FILE ATTRIBUTE VALUE` overwrites an integer root attribute in place;
// `setelem FILE DATASET INDEX VALUE` one element of a 1-D integer dataset.
#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "setint") == 0) {
    const hid_t f = H5Fopen(argv[2], H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t a = H5Aopen(f, argv[3], H5P_DEFAULT);
    const long long v = std::atoll(argv[4]);
    const int rc = a < 0 || H5Awrite(a, H5T_NATIVE_LLONG, &v) < 0;
    H5Aclose(a);
    H5Fclose(f);
    return rc;
  }
  if (argc == 6 && std::strcmp(argv[1], "setelem") == 0) {
    const hid_t f = H5Fopen(argv[2], H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t d = H5Dopen2(f, argv[3], H5P_DEFAULT);
    const hid_t fs = H5Dget_space(d);
    const hsize_t at[1] = {static_cast<hsize_t>(std::atoll(argv[4]))}, one[1] = {1};
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, at, nullptr, one, nullptr);
    const hid_t ms = H5Screate_simple(1, one, nullptr);
    const long long v = std::atoll(argv[5]);
    const int rc = d < 0 || H5Dwrite(d, H5T_NATIVE_LLONG, ms, fs, H5P_DEFAULT, &v) < 0;
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    H5Fclose(f);
    return rc;
  }
  if (argc != 4) {
    std::fprintf(stderr, "usage: h5_damage delete|reshape FILE DATASET | setint FILE ATTR VALUE\n");
    return 2;
  }
  const hid_t f = H5Fopen(argv[2], H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) return 1;
  int rc = 0;
  if (std::strcmp(argv[1], "delete") == 0) {
    rc = H5Ldelete(f, argv[3], H5P_DEFAULT) < 0;
  } else if (std::strcmp(argv[1], "reshape") == 0) {
    const hid_t d = H5Dopen2(f, argv[3], H5P_DEFAULT);
    const hid_t s = H5Dget_space(d);
    std::vector<hsize_t> dims(static_cast<size_t>(H5Sget_simple_extent_ndims(s)));
    H5Sget_simple_extent_dims(s, dims.data(), nullptr);
    H5Sclose(s);
    H5Dclose(d);
    H5Ldelete(f, argv[3], H5P_DEFAULT);
    dims[0] += 1;
    const hid_t s2 = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t d2 = H5Dcreate2(f, argv[3], H5T_IEEE_F32LE, s2, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    rc = d2 < 0;
    H5Dclose(d2);
    H5Sclose(s2);
  } else {
    rc = 2;
  }
  H5Fclose(f);
  return rc;
}
