// printf-style formatting into std::string (no <format> in GCC 12).
#pragma once
#include <cstdarg>
#include <cstdio>
#include <string>

namespace mpiformer {

__attribute__((format(printf, 1, 2))) inline std::string strprintf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
  va_end(ap2);
  return out;
}

}  // namespace mpiformer
