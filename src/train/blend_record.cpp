#include "train/blend_record.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/error.hpp"
#include "core/format.hpp"

namespace mpiformer {

namespace {

constexpr const char* kField = "attribute data_blend";

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out(1);
  for (const char c : line) {
    if (c == sep) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

int64_t count_of(const std::string& s, const std::string& file) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < 0) {
    throw InputError(file, kField, "\"" + s + "\" is not a count");
  }
  return v;
}

}  // namespace

std::string BlendRecord::to_text() const {
  std::string out = strprintf("start\t%lld\n", static_cast<long long>(start));
  for (const BlendEntry& e : sources) {
    out += strprintf("source\t%s\t%s\t%lld\t%s\t%lld\t%lld\n", e.name.c_str(),
                     shortest_decimal(e.weight).c_str(), static_cast<long long>(e.windows),
                     e.fingerprint.c_str(), static_cast<long long>(e.base),
                     static_cast<long long>(e.count));
  }
  return out;
}

BlendRecord BlendRecord::parse(const std::string& text, const std::string& file) {
  BlendRecord r;
  std::istringstream in(text);
  std::string line;
  bool has_start = false;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = split(line, '\t');
    if (f[0] == "start" && f.size() == 2 && !has_start) {
      r.start = count_of(f[1], file);
      has_start = true;
    } else if (f[0] == "source" && f.size() == 7) {
      BlendEntry e;
      e.name = f[1];
      char* end = nullptr;
      e.weight = std::strtod(f[2].c_str(), &end);
      if (*end != '\0' || !(e.weight > 0) || !std::isfinite(e.weight))
        throw InputError(file, kField, "source \"" + e.name + "\": weight \"" + f[2] + "\" is not > 0");
      e.windows = count_of(f[3], file);
      e.fingerprint = f[4];
      e.base = count_of(f[5], file);
      e.count = count_of(f[6], file);
      if (e.count < e.base)
        throw InputError(file, kField, "source \"" + e.name + "\": fewer samples than at its start");
      r.sources.push_back(std::move(e));
    } else {
      throw InputError(file, kField, "unexpected line \"" + line + "\"");
    }
  }
  if (!has_start || r.sources.empty())
    throw InputError(file, kField, "expected a start line and one line per source");
  return r;
}

std::string BlendRecord::differences(const BlendRecord& recorded, const BlendRecord& now) {
  std::string out;
  const auto add = [&](const std::string& s) { out += (out.empty() ? "" : "; ") + s; };
  const auto find = [](const BlendRecord& r, const std::string& name) -> const BlendEntry* {
    for (const BlendEntry& e : r.sources)
      if (e.name == name) return &e;
    return nullptr;
  };
  for (const BlendEntry& was : recorded.sources) {
    const BlendEntry* is = find(now, was.name);
    if (is == nullptr) {
      add("source \"" + was.name + "\" is gone");
      continue;
    }
    if (is->weight != was.weight)
      add(strprintf("source \"%s\": weight %s in the checkpoint, %s in the deck", was.name.c_str(),
                    shortest_decimal(was.weight).c_str(), shortest_decimal(is->weight).c_str()));
    if (is->fingerprint != was.fingerprint || is->windows != was.windows)
      add(strprintf("source \"%s\": its files differ (%lld windows, fingerprint %s in the "
                    "checkpoint; %lld, %s now)",
                    was.name.c_str(), static_cast<long long>(was.windows), was.fingerprint.c_str(),
                    static_cast<long long>(is->windows), is->fingerprint.c_str()));
  }
  for (const BlendEntry& is : now.sources)
    if (find(recorded, is.name) == nullptr) add("source \"" + is.name + "\" is new");
  // The same sources in another order draw another stream.
  if (out.empty()) {
    for (size_t i = 0; i < now.sources.size(); ++i)
      if (now.sources[i].name != recorded.sources[i].name) {
        add("the sources are listed in another order");
        break;
      }
  }
  return out;
}

}  // namespace mpiformer
