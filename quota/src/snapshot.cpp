#include "forge/quota/snapshot.h"

#include "forge/common/json.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace forge::quota {

std::string snapshot_to_json(const UsageSnapshot& s) {
  Json teams = Json::object();
  for (const auto& [name, u] : s.teams)
    teams[name] = {{"used_gpu_hours", u.used_gpu_hours},
                   {"reserved_gpu_hours", u.reserved_gpu_hours},
                   {"running_gpus", u.running_gpus}};
  const Json doc = {{"format", kSnapshotFormat},       {"generated_at", s.generated_at},
                    {"period", period_name(s.period)}, {"period_start", s.period_start},
                    {"period_end", s.period_end},      {"teams", teams}};
  return doc.dump(2) + "\n";
}

std::optional<UsageSnapshot> read_snapshot(const std::string& path, std::string* why) {
  const auto no = [&](const std::string& w) -> std::optional<UsageSnapshot> {
    if (why) *why = w;
    return std::nullopt;
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return no(fmt::format("usage snapshot '{}' cannot be read ({})", path, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  try {
    const Json doc = Json::parse(text.str());
    if (doc.value("format", "") != kSnapshotFormat)
      return no(fmt::format("usage snapshot '{}' is not in format {}", path, kSnapshotFormat));
    UsageSnapshot s;
    s.generated_at = doc.at("generated_at").get<int64_t>();
    const std::string period = doc.at("period").get<std::string>();
    s.period = period == "year" ? Period::kYear : period == "quarter" ? Period::kQuarter : Period::kMonth;
    s.period_start = doc.at("period_start").get<int64_t>();
    s.period_end = doc.at("period_end").get<int64_t>();
    for (const auto& [name, u] : doc.at("teams").items())
      s.teams[name] = {u.at("used_gpu_hours").get<double>(), u.at("reserved_gpu_hours").get<double>(),
                       u.value("running_gpus", 0)};
    return s;
  } catch (const Json::exception& e) {
    return no(fmt::format("usage snapshot '{}' is malformed: {}", path, e.what()));
  }
}

std::string format_age(int64_t seconds) {
  if (seconds < 60) return fmt::format("{}s", seconds);
  if (seconds < 3600) return fmt::format("{}m", seconds / 60);
  if (seconds < 86400) return fmt::format("{}h {:02}m", seconds / 3600, seconds / 60 % 60);
  return fmt::format("{}d {}h", seconds / 86400, seconds / 3600 % 24);
}

std::optional<std::string> snapshot_staleness(const UsageSnapshot& s, const Policy& policy, int64_t now) {
  const auto [start, end] = period_bounds(policy.period, now);
  if (s.period != policy.period || s.period_start != start)
    return fmt::format("the usage snapshot is for another budget period (written {} ago)",
                       format_age(std::max<int64_t>(0, now - s.generated_at)));
  if (now - s.generated_at > policy.snapshot_max_age_s)
    return fmt::format("the usage snapshot was written {} ago, older than the {} the policy allows",
                       format_age(now - s.generated_at), format_age(policy.snapshot_max_age_s));
  (void)end;
  return std::nullopt;
}

}  // namespace forge::quota
