#include "ini.h"

#include "forge/common/error.h"

#include <charconv>
#include <sstream>

namespace forge::quota {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::optional<int64_t> parse_int(std::string_view s) {
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) {
    item = trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<IniSection> parse_ini(const std::string& text, const std::string& name) {
  std::vector<IniSection> sections;
  std::istringstream in(text);
  std::string raw;
  for (int number = 1; std::getline(in, raw); ++number) {
    const std::string t = trim(raw);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[') {
      if (t.back() != ']' || t.size() < 3)
        fail(ExitCode::kUsage, "{}:{}: malformed section header '{}' (expected [name])", name, number, t);
      const std::string section = trim(t.substr(1, t.size() - 2));
      for (const auto& s : sections)
        if (s.name == section)
          fail(ExitCode::kUsage, "{}:{}: section [{}] already appears on line {}; merge the two", name,
               number, section, s.line);
      sections.push_back({section, number, {}});
      continue;
    }
    const auto eq = t.find('=');
    if (eq == std::string::npos || trim(t.substr(0, eq)).empty())
      fail(ExitCode::kUsage, "{}:{}: expected 'key = value', got '{}'", name, number, t);
    if (sections.empty())
      fail(ExitCode::kUsage, "{}:{}: '{}' is outside any [section]", name, number, trim(t.substr(0, eq)));
    IniEntry entry{trim(t.substr(0, eq)), trim(t.substr(eq + 1)), number};
    for (const auto& e : sections.back().entries)
      if (e.key == entry.key)
        fail(ExitCode::kUsage, "{}:{}: {} is already set on line {}", name, number, entry.key, e.line);
    sections.back().entries.push_back(std::move(entry));
  }
  return sections;
}

}  // namespace forge::quota
