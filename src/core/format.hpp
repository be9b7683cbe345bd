// printf-style formatting into std::string (no <format> in GCC 12).
#pragma once
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
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

// Seconds as a clock reads: "m:ss", or "h:mm:ss" from an hour.
inline std::string clock_duration(double s) {
  const auto t = static_cast<long long>(s + 0.5);
  return t >= 3600 ? strprintf("%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60)
                   : strprintf("%lld:%02lld", t / 60, t % 60);
}

// `s` as a JSON string: quotes, backslashes and control characters escaped
// (environment values and error reasons may hold any of them).
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += strprintf("\\u%04x", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The shortest decimal that reads back as the same double (0.003, not
// 0.0030000000000000001), always with a '.' or exponent so TOML keeps it a
// float.
inline std::string shortest_decimal(double x) {
  std::string s;
  for (int digits = 1; digits <= 17; ++digits) {
    s = strprintf("%.*g", digits, x);
    if (std::strtod(s.c_str(), nullptr) == x) break;
  }
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace mpiformer
