#include "forge/common/ini.h"

#include "forge/common/error.h"
#include "forge/common/text.h"

#include <fstream>
#include <sstream>

namespace forge {

const IniEntry* IniSection::find(const std::string& key) const {
  for (const auto& e : entries)
    if (e.key == key) return &e;
  return nullptr;
}

std::vector<IniSection> parse_ini(const std::string& text, const std::string& name) {
  std::vector<IniSection> sections;
  std::istringstream in(text);
  std::string raw;
  for (int number = 1; std::getline(in, raw); ++number) {
    std::string t = trim(raw);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[') {
      if (t.back() != ']' || t.size() < 3)
        fail(ExitCode::kUsage, "{}:{}: malformed section header '{}' (expected [name])", name, number, t);
      const std::string section = trim(std::string_view(t).substr(1, t.size() - 2));
      for (const auto& s : sections)
        if (s.name == section)
          fail(ExitCode::kUsage, "{}:{}: section [{}] already appears on line {}; merge the two", name,
               number, section, s.line);
      sections.push_back({section, number, {}});
      continue;
    }
    t = trim(std::string_view(t).substr(0, t.find('#')));
    const auto eq = t.find('=');
    if (eq == std::string::npos || trim(std::string_view(t).substr(0, eq)).empty())
      fail(ExitCode::kUsage, "{}:{}: expected 'key = value', got '{}'", name, number, t);
    const std::string key = trim(std::string_view(t).substr(0, eq));
    if (sections.empty()) fail(ExitCode::kUsage, "{}:{}: '{}' is outside any [section]", name, number, key);
    if (const IniEntry* e = sections.back().find(key))
      fail(ExitCode::kUsage, "{}:{}: {}.{} is already set on line {}", name, number, sections.back().name,
           key, e->line);
    sections.back().entries.push_back({key, trim(std::string_view(t).substr(eq + 1)), number});
  }
  return sections;
}

std::vector<IniSection> read_ini(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ExitCode::kUsage, "cannot read '{}': check the path and permissions", printable(path, 256));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_ini(text.str(), path);
}

}  // namespace forge
