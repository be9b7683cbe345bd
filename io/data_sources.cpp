#include "data_sources.hpp"

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/format.hpp"

namespace mpiformer {

namespace {

// At most this many sources: each costs a few numbers per sample drawn
// (blend_order.hpp walks them all), and real blends have tens.
constexpr size_t kMostSources = 1024;

std::string default_name(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string stem = p.stem().string();
  if (stem.find_first_of("*?[") == std::string::npos && !stem.empty()) return stem;
  const std::string folder = p.parent_path().filename().string();
  return folder.empty() ? stem : folder;
}

std::string quoted(const std::string& s) {
  std::ostringstream os;
  os << toml::value(s);
  return os.str();
}

}  // namespace

std::vector<DataSource> parse_data_sources(const toml::value& array, const std::string& deck) {
  if (!array.is_array()) {
    throw InputError(deck, "[[data.source]]",
                     "expected tables ([[data.source]] path = \"...\" weight = 0.7), got a " +
                         std::string(array.is_table() ? "single table ([data.source])" : "value"));
  }
  const auto& items = array.as_array();
  if (items.empty() || items.size() > kMostSources) {
    throw InputError(deck, "[[data.source]]",
                     strprintf("%zu sources: expected 1 to %zu", items.size(), kMostSources));
  }
  std::vector<DataSource> out;
  std::set<std::string> names;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string where = strprintf("[[data.source]] %zu", i + 1);
    if (!items[i].is_table()) throw InputError(deck, where, "expected a table");
    DataSource s;
    bool has_path = false, has_weight = false;
    for (const auto& [key, v] : items[i].as_table()) {
      const std::string field = where + " " + key;
      if (key == "path" || key == "val" || key == "name") {
        if (!v.is_string() || v.as_string().str.empty())
          throw InputError(deck, field, "expected a non-empty string");
        (key == "path" ? s.path : key == "val" ? s.val : s.name) = v.as_string().str;
        has_path |= key == "path";
      } else if (key == "weight") {
        if (!v.is_integer() && !v.is_floating())
          throw InputError(deck, field, "expected a number > 0 (the source's share of samples)");
        s.weight = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
        if (!(s.weight > 0) || !std::isfinite(s.weight))
          throw InputError(deck, field,
                           "expected a finite number > 0 (the source's share of samples), got " +
                               toml::format(v));
        has_weight = true;
      } else {
        throw InputError(deck, field, "unknown key (known: path, weight, val, name)");
      }
    }
    if (!has_path) throw InputError(deck, where + " path", "missing (a token dataset: a file or a glob)");
    if (!has_weight) throw InputError(deck, where + " weight", "missing (a number > 0)");
    if (s.name.empty()) s.name = default_name(s.path);
    for (const char c : s.name)
      if (static_cast<unsigned char>(c) < 0x20)
        throw InputError(deck, where + " name", "holds a control character (a tab or newline)");
    if (!names.insert(s.name).second) {
      throw InputError(deck, where + " name",
                       "\"" + s.name + "\" names another source too: give each a distinct name");
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string data_sources_toml(const std::vector<DataSource>& sources) {
  std::string out;
  for (const DataSource& s : sources) {
    out += "\n[[data.source]]\nname = " + quoted(s.name) + "\npath = " + quoted(s.path) +
           "\nweight = " + shortest_decimal(s.weight) + "\n";
    if (!s.val.empty()) out += "val = " + quoted(s.val) + "\n";
  }
  return out;
}

}  // namespace mpiformer
