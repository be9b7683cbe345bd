// Checks an HDF5 call (a negative return is failure): the call, the file
// and line, and what was being read or written, thrown as SystemError.
#pragma once
#include "core/error.hpp"

#define H5_CHECK(call, what)                                                               \
  do {                                                                                     \
    if ((call) < 0) ::mpiformer::throw_system_error(#call, __FILE__, __LINE__, (what));    \
  } while (0)
