// forge-health's INI configuration (configs/health.example.ini): the checks of each mode and the
// thresholds. Read with the project's config loader, so a bad key or value is a usage error naming
// file:line; a check name nobody knows is not an error but one warning line (resolve_checks).
#pragma once

#include "forge/health/checks.h"

#include <array>
#include <string>
#include <vector>

namespace forge::health {

struct LoadedConfig {
  HealthConfig config;
  std::string path;                        // "" for the built-in defaults
  std::array<std::string, 3> mode_source;  // where each mode's list came from ("file:line", "default")
};

// `path` "" gives the built-in defaults. Throws forge::Error(kUsage) naming the file, line and key.
LoadedConfig load_health_config(const std::string& path);

// The known checks of `mode`, in order, without duplicates; each unknown name adds one warning line
// "<source>: modes.<mode>: unknown check '<name>' ignored (known: ...)" and is never run.
std::vector<std::string> resolve_checks(const LoadedConfig& loaded, Mode mode,
                                        std::vector<std::string>& warnings);

}  // namespace forge::health
