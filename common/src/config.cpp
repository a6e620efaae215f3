#include "forge/common/config.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/ini.h"

#include <boost/program_options/parsers.hpp>
#include <boost/program_options/variables_map.hpp>

#include <algorithm>
#include <sstream>

namespace po = boost::program_options;

namespace forge {
namespace {

// The file's entries as Boost.Program_options would parse them (parse_config_file: key "section.key",
// one value, unregistered when the schema lacks it), read by forge::parse_ini so the job spec, the quota
// policy and the SPANK plugin share one INI syntax. `lines` gets each key's line for messages.
po::parsed_options parse_file(const ConfigSchema& schema, const std::string& path,
                              std::map<std::string, int>& lines) {
  po::parsed_options parsed(&schema.options());
  for (const IniSection& section : read_ini(path)) {
    for (const IniEntry& e : section.entries) {
      po::option opt;
      opt.string_key = section.name + "." + e.key;
      opt.value = {e.value};
      opt.original_tokens = {opt.string_key, e.value};
      opt.unregistered = !schema.options().find_nothrow(opt.string_key, false);
      lines[opt.string_key] = e.line;
      parsed.options.push_back(std::move(opt));
    }
  }
  return parsed;
}

std::string strip_dashes(std::string name) {
  name.erase(0, name.find_first_not_of('-'));
  return name;
}

std::string value_to_string(const boost::any& v) {
  if (const auto* b = boost::any_cast<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = boost::any_cast<int>(&v)) return std::to_string(*i);
  if (const auto* l = boost::any_cast<int64_t>(&v)) return std::to_string(*l);
  if (const auto* d = boost::any_cast<double>(&v)) return fmt::format("{}", *d);  // shortest round-trip
  if (const auto* s = boost::any_cast<std::string>(&v)) return *s;
  return "?";
}

std::string type_name(const boost::any& v) {
  if (v.type() == typeid(bool)) return "true or false";
  if (v.type() == typeid(int) || v.type() == typeid(int64_t)) return "an integer";
  if (v.type() == typeid(double)) return "a number";
  return "a string";
}

}  // namespace

void ConfigSchema::check_new_key(const std::string& key) const {
  if (key.find('.') == std::string::npos || keys_.count(key))
    throw std::logic_error("config key must be new and look like section.key: " + key);
}

ConfigSchema& ConfigSchema::add_choice(const std::string& key, const std::string& default_value,
                                       std::vector<std::string> allowed, const std::string& help) {
  add<std::string>(key, default_value, help);
  keys_[key].allowed = std::move(allowed);
  return *this;
}

std::vector<std::string> ConfigSchema::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, _] : keys_) out.push_back(k);
  return out;
}

const boost::any& Config::value(const std::string& key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) throw std::logic_error("config key not in schema: " + key);
  return it->second;
}

std::string Config::source(const std::string& key) const {
  const auto it = sources_.find(key);
  return it == sources_.end() ? "default" : it->second;
}

void Config::reject(const std::string& key, const std::string& why) const {
  const auto it = text_.find(key);
  fail(ExitCode::kUsage, "{}: {} = {}: {}", source(key), key, it == text_.end() ? "?" : it->second, why);
}

std::string Config::to_ini() const {
  std::ostringstream out;
  std::string section;
  for (const auto& [key, value] : text_) {
    const auto dot = key.find('.');
    if (key.substr(0, dot) != section) {
      section = key.substr(0, dot);
      out << (out.tellp() > 0 ? "\n" : "") << '[' << section << "]\n";
    }
    out << key.substr(dot + 1) << " = " << value << '\n';
  }
  return out.str();
}

std::string Config::hash() const {
  return xxh3_64_hex(to_ini());
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    // Levenshtein distance, one row at a time.
    std::vector<size_t> row(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= c.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (word[i - 1] == c[j - 1] ? 0 : 1)});
        diagonal = up;
      }
    }
    if (row[c.size()] < best_distance) best_distance = row[c.size()], best = c;
  }
  return best;
}

Config load_config(const ConfigSchema& schema, const std::string& path,
                   const std::vector<std::string>& overrides) {
  std::map<std::string, int> lines;
  const po::parsed_options file =
      path.empty() ? po::parsed_options(&schema.options()) : parse_file(schema, path, lines);
  const auto where = [&](const std::string& key, bool from_cmdline) {
    if (from_cmdline) return std::string("command line");
    const auto it = lines.find(key);
    return it == lines.end() ? path : fmt::format("{}:{}", path, it->second);
  };
  const auto unknown = [&](const std::string& key, bool from_cmdline) {
    const std::string guess = did_you_mean(key, schema.keys());
    fail(ExitCode::kUsage, "{}: unknown key '{}'{}", where(key, from_cmdline), key,
         guess.empty() ? std::string("") : fmt::format("; did you mean '{}'?", guess));
  };

  po::variables_map vm;
  std::map<std::string, bool> from_cmdline;
  const auto store = [&](const po::parsed_options& parsed, bool cmdline) {
    for (const auto& opt : parsed.options) {
      const std::string key = strip_dashes(opt.string_key);
      if (opt.unregistered || opt.position_key >= 0) {
        if (opt.position_key >= 0)
          fail(ExitCode::kUsage, "command line: expected --section.key=value, got '{}'",
               opt.value.empty() ? "" : opt.value[0]);
        unknown(key, cmdline);
      }
      if (cmdline && from_cmdline.count(key)) fail(ExitCode::kUsage, "command line: {} given twice", key);
      from_cmdline.emplace(key, cmdline);
    }
    try {
      po::store(parsed, vm);
    } catch (const po::error_with_option_name& e) {
      const std::string key = strip_dashes(e.get_option_name());
      const auto* sem = schema.options().find_nothrow(key, false);
      boost::any def;
      if (sem) sem->semantic()->apply_default(def);
      fail(ExitCode::kUsage, "{}: {}: bad value{}", where(key, cmdline), key,
           def.empty() ? std::string("") : " (expected " + type_name(def) + ")");
    }
  };

  // Command line first: Boost keeps the first value stored for a key, so overrides win over the file.
  store(po::command_line_parser(overrides).options(schema.options()).allow_unregistered().run(), true);
  store(file, false);
  try {
    po::notify(vm);
  } catch (const po::required_option& e) {
    fail(ExitCode::kUsage, "{}: required key '{}' is not set (add it to the file or pass --{}=...)",
         path.empty() ? "command line" : path, strip_dashes(e.get_option_name()),
         strip_dashes(e.get_option_name()));
  }

  Config config;
  for (const auto& [key, info] : schema.keys_) {
    const auto it = vm.find(key);
    if (it == vm.end()) continue;
    config.values_[key] = it->second.value();
    config.text_[key] = value_to_string(it->second.value());
    if (!it->second.defaulted()) config.sources_[key] = where(key, from_cmdline[key]);
    if (!info.allowed.empty() &&
        std::find(info.allowed.begin(), info.allowed.end(), config.text_[key]) == info.allowed.end()) {
      std::string allowed;
      for (const auto& a : info.allowed) allowed += (allowed.empty() ? "" : ", ") + a;
      config.reject(key, "must be one of: " + allowed);
    }
  }
  return config;
}

}  // namespace forge
