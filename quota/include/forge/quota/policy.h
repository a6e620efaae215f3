// The admission and accounting policy: teams, tiers, prices and topology rules, read from one INI file
// (configs/quota.example.ini, docs/ADMISSION.md). Every consumer — `forge-quota`, the SPANK plugin,
// job_submit.lua — reads the same file, so a rule has exactly one place to change.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace forge::quota {

struct Tier {
  std::string name;
  std::string qos;           // the Slurm QOS jobs of this tier run under
  int priority = 0;          // QOS Priority
  bool preemptible = false;  // may be preempted (requeued) by higher-priority non-preemptible tiers
  int64_t max_wall_s = 0;    // longest wall time a job of this tier may ask for (QOS MaxWall)
  double charge = 1.0;       // budget GPU-hours per GPU-hour (QOS UsageFactor)
  int grace_s = 0;           // QOS GraceTime: seconds to checkpoint before a preemption requeues
};

struct Team {
  std::string name;
  std::string account;              // Slurm account
  std::vector<std::string> users;   // Unix user names
  std::vector<std::string> groups;  // Unix group names (written @group in the file)
  double budget_gpu_hours = 0;      // charged GPU-hours per period
  int max_gpus = 0;                 // GPUs the team may hold at once (GrpTRES=gres/gpu)
  std::vector<std::string> tiers;   // tier names the team may use
  bool allows_tier(const std::string& tier) const;
  // A member is a listed user, or a user in one of the listed groups (`user_groups`: all of them).
  bool has_member(const std::string& user, const std::vector<std::string>& user_groups) const;
};

struct Prices {
  double default_per_gpu_hour = 0;
  std::map<std::string, double> partition;  // per GPU-hour by partition
  std::map<std::string, double> gpu_type;   // per GPU-hour by GPU type (wins over partition)
  double per_gpu_hour(const std::string& partition_name, const std::string& gpu_type_name) const;
};

struct SwitchRule {
  int max_gpus = 0;      // applies to jobs of up to this many GPUs...
  int max_switches = 0;  // ...which must sit under at most this many leaf switches
};

struct Topology {
  int gpus_per_node = 8;
  bool tp_within_node = true;
  bool pp_align_nodes = true;
  std::vector<SwitchRule> max_switches;  // sorted by max_gpus
  // The switch limit for a job of `gpus` GPUs, or 0 when no rule covers it.
  int switches_for(int gpus) const;
};

enum class Period { kMonth, kQuarter, kYear };

struct Policy {
  std::string path;  // the file it was read from
  std::string cluster;
  Period period = Period::kMonth;
  std::string ledger_path;
  std::string snapshot_path;
  int64_t snapshot_max_age_s = 900;
  // Time limit job_submit.lua gives jobs submitted without one (0: none). Slurm starts a job under a
  // GrpTRESMins budget only if it can finish within it (AccountingStorageEnforce=safe), so a job
  // without a time limit would never start.
  int64_t default_wall_s = 0;
  std::vector<std::string> runs_dirs;
  std::map<std::string, Tier> tiers;
  std::map<std::string, Team> teams;
  Prices prices;
  Topology topology;

  const Team* team(const std::string& name) const;
  const Tier* tier(const std::string& name) const;
  const Tier* tier_by_qos(const std::string& qos) const;
  const Team* team_by_account(const std::string& account) const;
  // Names joined for messages: "pretrain, finetune".
  std::string tier_names() const;
  std::string team_names() const;
};

// Reads and validates a policy file. Throws forge::Error(kUsage) "<file>:<line>: <what> ..." for a bad
// key or value, and forge::Error(kUsage) naming the file when it cannot be read.
Policy load_policy(const std::string& path);
// The same from text; `name` stands for the file in messages.
Policy parse_policy(const std::string& text, const std::string& name);

// "48:00:00", "2-00:00:00", "90" (minutes, as Slurm reads a bare number) -> seconds; nullopt if malformed.
std::optional<int64_t> parse_wall_time(const std::string& text);
// Seconds -> Slurm's "D-HH:MM:SS" / "HH:MM:SS".
std::string format_wall_time(int64_t seconds);

const char* period_name(Period p);
// [start, end) of the period containing `now` (Unix seconds, UTC).
std::pair<int64_t, int64_t> period_bounds(Period p, int64_t now);

}  // namespace forge::quota
