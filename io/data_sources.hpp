// [[data.source]]: the deck's blend of training sources, parsed and written
// back. Internal to io (deck.cpp); toml11 stays a private dependency.
#pragma once
#include <string>
#include <toml.hpp>
#include <vector>

#include "deck.hpp"

namespace mpiformer {

// The array of tables under [data] "source" into sources, every key
// type- and range-checked (InputError naming the deck and
// "[[data.source]] <n> <key>"): path (a string), weight (a finite number >
// 0), val and name (strings; a name defaults to the path's stem, or its
// folder's name for a glob, and names must differ).
std::vector<DataSource> parse_data_sources(const toml::value& array, const std::string& deck);

// The sources as [[data.source]] tables, to follow the resolved [data].
std::string data_sources_toml(const std::vector<DataSource>& sources);

}  // namespace mpiformer
