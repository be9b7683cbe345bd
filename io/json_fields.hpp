// Fields of JSON files written by other tools (Hugging Face's config.json
// and safetensors index, a safetensors header), read with their types
// checked: a number where a string belongs, a fraction where a count
// belongs, null or an object are each an InputError naming the file and
// the field, never a library exception or a value silently truncated.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace mpiformer {

// A JSON value's kind, for the messages.
inline std::string json_kind(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number " + v.dump();
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// `key` of object `o`: present (or the default, where one is given), and of
// the right type. `file` and `field` name it in the messages.
inline int64_t json_integer(const nlohmann::json& v, const std::string& file, const std::string& field) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw InputError(file, field, "an integer too large");
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  throw InputError(file, field, "must be a whole number, not " + json_kind(v));
}
inline double json_number(const nlohmann::json& v, const std::string& file, const std::string& field) {
  if (!v.is_number()) throw InputError(file, field, "must be a number, not " + json_kind(v));
  return v.get<double>();
}
inline bool json_bool(const nlohmann::json& v, const std::string& file, const std::string& field) {
  if (!v.is_boolean()) throw InputError(file, field, "must be true or false, not " + json_kind(v));
  return v.get<bool>();
}
inline std::string json_string(const nlohmann::json& v, const std::string& file, const std::string& field) {
  if (!v.is_string()) throw InputError(file, field, "must be a string, not " + json_kind(v));
  return v.get<std::string>();
}

// The same for a key of an object, with a default where it may be absent
// (a null counts as absent where the other tool writes null for "unset").
inline const nlohmann::json* json_field(const nlohmann::json& o, const std::string& key) {
  if (!o.is_object()) return nullptr;
  const auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}
inline int64_t json_integer(const nlohmann::json& o, const std::string& key, const std::string& file,
                            int64_t fallback) {
  const nlohmann::json* v = json_field(o, key);
  return v != nullptr ? json_integer(*v, file, key) : fallback;
}
inline double json_number(const nlohmann::json& o, const std::string& key, const std::string& file,
                          double fallback) {
  const nlohmann::json* v = json_field(o, key);
  return v != nullptr ? json_number(*v, file, key) : fallback;
}
inline bool json_bool(const nlohmann::json& o, const std::string& key, const std::string& file,
                      bool fallback) {
  const nlohmann::json* v = json_field(o, key);
  return v != nullptr ? json_bool(*v, file, key) : fallback;
}
inline std::string json_string(const nlohmann::json& o, const std::string& key,
                               const std::string& file, const std::string& fallback) {
  const nlohmann::json* v = json_field(o, key);
  return v != nullptr ? json_string(*v, file, key) : fallback;
}

// A JSON text parsed with duplicate keys refused (the standard leaves them
// undefined; a header or config with two values for one key is damaged or
// crafted, and which one a reader takes differs between readers).
inline nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& file,
                                        const std::string& field) {
  std::string duplicate;
  std::vector<std::set<std::string>> seen;  // keys per open object
  const nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t e,
                                                   nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (e == E::object_start) {
      seen.emplace_back();
    } else if (e == E::object_end) {
      if (!seen.empty()) seen.pop_back();
    } else if (e == E::key && !seen.empty()) {
      std::string k = parsed.get<std::string>();
      if (!seen.back().insert(k).second && duplicate.empty()) duplicate = std::move(k);
    }
    (void)depth;
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(begin, end, cb);
  } catch (const std::exception& e) {
    throw InputError(file, field, std::string("not JSON: ") + e.what());
  }
  if (!duplicate.empty()) throw InputError(file, field, "the key \"" + duplicate + "\" appears twice");
  return j;
}

}  // namespace mpiformer
