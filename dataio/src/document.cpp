#include "forge/dataio/document.h"

#include "forge/common/error.h"

#include <algorithm>

namespace forge::data {

void check_domain_name(const std::string& name, const std::string& where) {
  const bool ok = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
  if (!ok)
    fail(ExitCode::kUsage, "{}: domain '{}' must be 1-64 characters of [A-Za-z0-9_-] (it names shard files)",
         where, name);
}

uint16_t Corpus::domain_id(const std::string& name) {
  const auto it = std::find(domains.begin(), domains.end(), name);
  if (it != domains.end()) return static_cast<uint16_t>(it - domains.begin());
  if (domains.size() >= 65535) fail(ExitCode::kUsage, "more than 65535 domains");
  domains.push_back(name);
  return static_cast<uint16_t>(domains.size() - 1);
}

}  // namespace forge::data
