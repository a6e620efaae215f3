// The one INI reader: job specs (through load_config, config.h), the quota policy, and the SPANK plugin's
// look at a spec's [parallel] and [model]. Standard library and forge::Error only, so the plugin embeds it.
//
// Syntax: "[section]" headers and "key = value" lines; '#' or ';' starts a comment line, and '#' anywhere
// ends the value (as Boost.Program_options' config files, which the job spec contract names). A section
// may appear once and a key once per section.
#pragma once

#include <string>
#include <vector>

namespace forge {

struct IniEntry {
  std::string key;
  std::string value;
  int line = 0;
};

struct IniSection {
  std::string name;
  int line = 0;
  std::vector<IniEntry> entries;
  // The entry of `key`, or null.
  const IniEntry* find(const std::string& key) const;
};

// Throws forge::Error(kUsage) "<name>:<line>: ..." for malformed lines, entries outside a section, and
// sections or keys given twice.
std::vector<IniSection> parse_ini(const std::string& text, const std::string& name);

// Reads and parses a file; a file that cannot be read is forge::Error(kUsage) naming it.
std::vector<IniSection> read_ini(const std::string& path);

}  // namespace forge
