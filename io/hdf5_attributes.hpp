// The scalar attributes of our HDF5 files (checkpoints, token datasets),
// written and read by one set of rules:
//  - every read checks the attribute's class, its element count (a scalar
//    or one element) and its size before reading, so a damaged or hand-made
//    file gives an InputError naming the file and the attribute, never a
//    crash;
//  - strings are written fixed-length (identical bytes on every rank, as
//    collective attribute writes need, and plain text to h5dump and h5py)
//    and read in either form (other tools write variable-length ones).
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>

namespace mpiformer {

void write_int_attr(hid_t obj, const char* name, int64_t v, const std::string& file);
void write_u64_attr(hid_t obj, const char* name, uint64_t v, const std::string& file);
void write_double_attr(hid_t obj, const char* name, double v, const std::string& file);
void write_string_attr(hid_t obj, const char* name, const std::string& v, const std::string& file);

bool has_attr(hid_t obj, const char* name);
// Each throws InputError(file, "attribute NAME", why) when the attribute is
// missing, of another kind, or not a single value.
int64_t read_int_attr(hid_t obj, const char* name, const std::string& file);
uint64_t read_u64_attr(hid_t obj, const char* name, const std::string& file);
double read_double_attr(hid_t obj, const char* name, const std::string& file);
std::string read_string_attr(hid_t obj, const char* name, const std::string& file);

}  // namespace mpiformer
