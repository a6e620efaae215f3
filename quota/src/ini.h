// A line-numbered INI reader for the policy file. common/'s load_config needs a fixed schema; the
// policy has sections named after teams and tiers, so it is read here and validated key by key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace forge::quota {

struct IniEntry {
  std::string key;
  std::string value;
  int line = 0;
};

struct IniSection {
  std::string name;
  int line = 0;
  std::vector<IniEntry> entries;
};

// Throws forge::Error(kUsage) "<name>:<line>: ..." for malformed lines and keys set twice.
std::vector<IniSection> parse_ini(const std::string& text, const std::string& name);

std::string trim(const std::string& s);
// "a, b ,c" -> {"a","b","c"}; empty items dropped.
std::vector<std::string> split_list(const std::string& s, char sep = ',');
// The whole of `s` as a decimal integer (an optional '-', no '+', no spaces); nullopt otherwise. Callers
// check the range, so each error names its own bounds.
std::optional<int64_t> parse_int(std::string_view s);

}  // namespace forge::quota
