// Job specs and tool configs: INI files with [section] key = value (read by forge::parse_ini, ini.h),
// overridable on the command line as --section.key=value. Typed and validated by Boost.Program_options;
// every error names the key, where it came from (file:line or the command line) and what is allowed.
#pragma once

#include <boost/any.hpp>
#include <boost/program_options/options_description.hpp>
#include <boost/program_options/value_semantic.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace forge {

class Config;
class ConfigSchema;
Config load_config(const ConfigSchema& schema, const std::string& path,
                   const std::vector<std::string>& overrides);

class ConfigSchema {
 public:
  // A key ("section.key") with a default value. T: bool, int, int64_t, double or std::string.
  template <typename T>
  ConfigSchema& add(const std::string& key, T default_value, const std::string& help) {
    return add_typed<T>(key, help, [default_value](auto* v) { v->default_value(default_value); });
  }
  // A key the file or the command line must set.
  template <typename T>
  ConfigSchema& add_required(const std::string& key, const std::string& help) {
    return add_typed<T>(key, help, [](auto* v) { v->required(); });
  }
  // A string key whose value must be one of `allowed`.
  ConfigSchema& add_choice(const std::string& key, const std::string& default_value,
                           std::vector<std::string> allowed, const std::string& help);

  const boost::program_options::options_description& options() const { return options_; }
  std::vector<std::string> keys() const;

 private:
  friend Config load_config(const ConfigSchema&, const std::string&, const std::vector<std::string>&);

  struct KeyInfo {
    std::vector<std::string> allowed;  // empty: any value of the type
  };

  template <typename T, typename Decorate>
  ConfigSchema& add_typed(const std::string& key, const std::string& help, Decorate decorate);
  void check_new_key(const std::string& key) const;

  boost::program_options::options_description options_{"options"};
  std::map<std::string, KeyInfo> keys_;
};

class Config {
 public:
  template <typename T>
  T get(const std::string& key) const {
    return boost::any_cast<T>(value(key));
  }
  // Where a key's value came from: "job.ini:12", "command line" or "default".
  std::string source(const std::string& key) const;
  // Throws a usage error (exit 64): "<source>: <key> = <value>: <why>".
  [[noreturn]] void reject(const std::string& key, const std::string& why) const;

  // The resolved configuration as INI text, sections and keys sorted: load_config(to_ini()) round-trips.
  std::string to_ini() const;
  // xxh3-64 (hex) of to_ini(): equal specs hash equal whatever their formatting or override order.
  std::string hash() const;
  // Resolved values as strings, by key.
  const std::map<std::string, std::string>& values() const { return text_; }

 private:
  friend Config load_config(const ConfigSchema&, const std::string&, const std::vector<std::string>&);
  const boost::any& value(const std::string& key) const;

  std::map<std::string, boost::any> values_;
  std::map<std::string, std::string> text_;
  std::map<std::string, std::string> sources_;
};

// Loads `path` (may be empty: defaults and overrides only) with `overrides` ("--section.key=value" or
// "--section.key" "value") taking precedence. Throws forge::Error(kUsage) naming file:line, the key,
// and a did-you-mean for unknown keys.
Config load_config(const ConfigSchema& schema, const std::string& path,
                   const std::vector<std::string>& overrides);

// The closest candidate by edit distance, or "" if nothing is close enough to suggest.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// ---- implementation of the template above ----
template <typename T, typename Decorate>
ConfigSchema& ConfigSchema::add_typed(const std::string& key, const std::string& help, Decorate decorate) {
  static_assert(std::is_same_v<T, bool> || std::is_same_v<T, int> || std::is_same_v<T, int64_t> ||
                    std::is_same_v<T, double> || std::is_same_v<T, std::string>,
                "config keys are bool, int, int64_t, double or std::string");
  check_new_key(key);
  auto* semantic = boost::program_options::value<T>();
  decorate(semantic);
  options_.add_options()(key.c_str(), semantic, help.c_str());
  keys_[key] = KeyInfo{};
  return *this;
}

}  // namespace forge
