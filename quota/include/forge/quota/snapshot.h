// The usage snapshot: what `forge-quota sync` knows about each team's GPU-hours this period, written as
// one small JSON file the SPANK plugin reads on every submission (no database in the plugin's path).
#pragma once

#include "forge/quota/policy.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace forge::quota {

struct TeamUsage {
  double used_gpu_hours = 0;      // charged GPU-hours of runs this period
  double reserved_gpu_hours = 0;  // charged GPU-hours running and pending jobs may still use
  int running_gpus = 0;
};

struct UsageSnapshot {
  int64_t generated_at = 0;  // Unix seconds
  Period period = Period::kMonth;
  int64_t period_start = 0, period_end = 0;
  std::map<std::string, TeamUsage> teams;
};

inline constexpr const char* kSnapshotFormat = "forge-quota-usage/1";

std::string snapshot_to_json(const UsageSnapshot& s);

// Reads a snapshot; nullopt with `why` set when the file is missing, unreadable or malformed.
std::optional<UsageSnapshot> read_snapshot(const std::string& path, std::string* why);

// Why a snapshot cannot be trusted at `now` ("written 2h 5m ago, older than 15m", "for an earlier
// period"), or nullopt when it is fresh.
std::optional<std::string> snapshot_staleness(const UsageSnapshot& s, const Policy& policy, int64_t now);

// Writes the snapshot atomically (temp file + rename) with mode 0644, so the plugin, running as the
// submitting user, can read it and never sees a half-written file.
void write_snapshot(const std::string& path, const UsageSnapshot& s);

// "2h 05m", "45s": ages in messages.
std::string format_age(int64_t seconds);

}  // namespace forge::quota
