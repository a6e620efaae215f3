#include "forge/common/log.h"

#include "forge/common/error.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace forge {

void init_logging(int rank, int world_size, std::string_view level, bool all_ranks) {
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off")
    fail(ExitCode::kUsage, "unknown log level '{}': use trace, debug, info, warn, error or off", level);
  if (rank != 0 && !all_ranks) lvl = std::max(lvl, spdlog::level::warn);
  // Not registered by name, so init_logging may run again (tests, re-initialisation after MPI start).
  auto logger = std::make_shared<spdlog::logger>(fmt::format("rank{}", rank),
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern(fmt::format("%Y-%m-%dT%H:%M:%S.%e [rank {}/{}] %l: %v", rank, world_size));
  logger->set_level(lvl);
  spdlog::set_default_logger(logger);
}

}  // namespace forge
