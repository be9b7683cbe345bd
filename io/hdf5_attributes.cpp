#include "hdf5_attributes.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "hdf5_handle.hpp"

namespace mpiformer {

namespace {

std::string field(const char* name) { return std::string("attribute ") + name; }

H5Handle open_scalar(hid_t obj, const char* name, H5T_class_t want, const char* what,
                     const std::string& file) {
  H5QuietErrors quiet;
  if (H5Aexists(obj, name) <= 0) throw InputError(file, field(name), "missing");
  H5Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) throw InputError(file, field(name), "unreadable");
  H5Handle type(H5Aget_type(a.get()), H5Tclose);
  if (!type.valid() || H5Tget_class(type.get()) != want) {
    throw InputError(file, field(name), std::string("expected ") + what);
  }
  H5Handle space(H5Aget_space(a.get()), H5Sclose);
  const hssize_t points = space.valid() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  if (points != 1) {
    throw InputError(file, field(name),
                     std::string("expected one value (") + what + "), got " +
                         (points < 0 ? std::string("an unreadable shape")
                                     : std::to_string(points) + " values"));
  }
  return a;
}

template <class T>
T read_integer(hid_t obj, const char* name, hid_t mem_type, const char* what,
               const std::string& file) {
  const H5Handle a = open_scalar(obj, name, H5T_INTEGER, what, file);
  T v = 0;
  H5QuietErrors quiet;
  // HDF5 converts any integer width; out-of-range values fail the read.
  if (H5Aread(a.get(), mem_type, &v) < 0) {
    throw InputError(file, field(name), std::string("unreadable as ") + what);
  }
  return v;
}

template <class T>
void write_scalar(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const T& v,
                  const std::string& file) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5_CHECK(a.get(), file + ": " + field(name));
  H5_CHECK(H5Awrite(a.get(), mem_type, &v), file + ": " + field(name));
}

}  // namespace

void write_int_attr(hid_t obj, const char* name, int64_t v, const std::string& file) {
  write_scalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, v, file);
}

void write_u64_attr(hid_t obj, const char* name, uint64_t v, const std::string& file) {
  write_scalar(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, v, file);
}

void write_double_attr(hid_t obj, const char* name, double v, const std::string& file) {
  write_scalar(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, v, file);
}

double read_double_attr(hid_t obj, const char* name, const std::string& file) {
  const H5Handle a = open_scalar(obj, name, H5T_FLOAT, "a number", file);
  double v = 0;
  H5QuietErrors quiet;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0)
    throw InputError(file, field(name), "unreadable as a number");
  return v;
}

void write_string_attr(hid_t obj, const char* name, const std::string& v, const std::string& file) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5_CHECK(H5Tset_size(type.get(), std::max<size_t>(v.size(), 1)), file + ": " + field(name));
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle a(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5_CHECK(a.get(), file + ": " + field(name));
  const std::string buf = v.empty() ? std::string(1, '\0') : v;
  H5_CHECK(H5Awrite(a.get(), type.get(), buf.data()), file + ": " + field(name));
}

bool has_attr(hid_t obj, const char* name) {
  H5QuietErrors quiet;
  return H5Aexists(obj, name) > 0;
}

int64_t read_int_attr(hid_t obj, const char* name, const std::string& file) {
  return read_integer<int64_t>(obj, name, H5T_NATIVE_INT64, "an integer", file);
}

uint64_t read_u64_attr(hid_t obj, const char* name, const std::string& file) {
  return read_integer<uint64_t>(obj, name, H5T_NATIVE_UINT64, "an unsigned integer", file);
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& file) {
  const H5Handle a = open_scalar(obj, name, H5T_STRING, "a string", file);
  H5QuietErrors quiet;
  H5Handle type(H5Aget_type(a.get()), H5Tclose);
  if (H5Tis_variable_str(type.get()) > 0) {
    // In the file's character set: HDF5 does not convert between ASCII and
    // UTF-8, and h5py writes UTF-8 by default.
    H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    if (H5Aread(a.get(), mem.get(), &s) < 0 || s == nullptr) {
      throw InputError(file, field(name), "unreadable string");
    }
    std::string out(s);
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  if (size == 0 || size > (size_t{1} << 30)) {
    throw InputError(file, field(name), "a string of impossible size " + std::to_string(size));
  }
  std::string out(size, '\0');
  if (H5Aread(a.get(), type.get(), out.data()) < 0) {
    throw InputError(file, field(name), "unreadable string");
  }
  return out.substr(0, out.find('\0'));
}

}  // namespace mpiformer
