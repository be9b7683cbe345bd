// TOML text parsed for a file of ours (an input deck, a machine file): a
// syntax error becomes the InputError every reader reports, naming the
// file. For io's own sources (toml11 is a private dependency of io).
#pragma once
#include <sstream>
#include <string>
#include <toml.hpp>

#include "core/error.hpp"

namespace mpiformer {

inline toml::value parse_toml_text(const std::string& text, const std::string& path) {
  try {
    std::istringstream in(text);
    return toml::parse(in, path);
  } catch (const std::exception& e) {
    throw InputError(path, "", std::string("not valid TOML:\n") + e.what());
  }
}

}  // namespace mpiformer
