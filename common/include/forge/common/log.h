// Logging through spdlog with every line prefixed by the rank, so interleaved multi-rank output stays
// readable: "2026-11-29T18:00:00.123 [rank 3/8] info: ...". Use spdlog::info/warn/error after init.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace forge {

// Sets the default logger to stderr with the rank prefix. `level`: trace, debug, info, warn, error, off
// (an unknown level is a usage error). Ranks other than 0 log at warn and above unless `all_ranks`.
void init_logging(int rank, int world_size, std::string_view level = "info", bool all_ranks = false);

}  // namespace forge
