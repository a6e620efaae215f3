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

// Who is asking: a Unix user and all of their groups. Always from the OS (identity.h), never from a flag.
struct Identity {
  std::string user;
  std::vector<std::string> groups;
};

// Users and groups a policy key lists ("alice, @ml"): team members, approvers, admins.
struct Principals {
  std::vector<std::string> users;   // Unix user names
  std::vector<std::string> groups;  // Unix group names (written @group in the file)
  // Listed by name, or a member of a listed group (`user_groups`: all of the user's groups).
  bool includes(const std::string& user, const std::vector<std::string>& user_groups) const;
  bool empty() const { return users.empty() && groups.empty(); }
  // As the policy writes them: "carol, @ml" ("none" when empty).
  std::string text() const;
};

// A user or group the policy names and where, so `forge-quota check-policy` can resolve each on the
// machine and cite its line (the parser itself makes no OS lookups).
struct PolicyName {
  std::string name;  // without the '@'
  bool group = false;
  std::string role;  // "member", "approver", "admin" or "group"
  std::string team;  // empty for admins
  int line = 0;
};

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
  std::string account;             // Slurm account
  Principals members;              // who may submit the team's jobs
  double budget_gpu_hours = 0;     // charged GPU-hours per period
  int max_gpus = 0;                // GPUs the team may hold at once (GrpTRES=gres/gpu)
  std::vector<std::string> tiers;  // tier names the team may use
  Principals approvers;            // who may approve the team's requests for large jobs
  std::string root;                // the team's directory (runs/ and datasets/ under it); empty: none
  std::string group;               // the Unix group that owns root (setgid 2770); empty: none
  bool allows_tier(const std::string& tier) const;
  // A member is a listed user, or a user in one of the listed groups (`user_groups`: all of them).
  bool has_member(const std::string& user, const std::vector<std::string>& user_groups) const;
  bool has_approver(const std::string& user, const std::vector<std::string>& user_groups) const;
};

// When a training job needs an approval ([approval]); a threshold of 0 turns its rule off.
struct ApprovalRules {
  int gpus = 0;                    // more GPUs than this in one job
  double gpu_hours = 0;            // more estimated GPU-hours (GPUs x time limit) than this
  std::vector<std::string> tiers;  // tiers whose jobs always need one
  int64_t ttl_s = 7 * 86400;       // how long an approval is valid unless the approver says otherwise
  std::string checker = "/usr/local/bin/forge-quota";  // what job_submit.lua runs to admit jobs
  std::string controller = "slurm";  // the user slurmctld runs as (SlurmUser): with root, the one who admits
};

// A set of Slurm partitions' worth of nodes and the tiers whose jobs may run there ([pool.NAME]).
struct Pool {
  std::string name;
  std::string partition;
  std::vector<std::string> tiers;
  bool allows_tier(const std::string& tier) const;
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
  Principals admins;  // see every team in reports and approvals; their jobs may keep run.dir anywhere
  std::map<std::string, Tier> tiers;
  std::map<std::string, Team> teams;
  std::vector<Pool> pools;  // in file order: a job without a partition goes to the first that fits
  ApprovalRules approval;
  Prices prices;
  Topology topology;
  std::vector<PolicyName> names;  // every user and group named, in file order

  const Team* team(const std::string& name) const;
  const Tier* tier(const std::string& name) const;
  const Tier* tier_by_qos(const std::string& qos) const;
  const Team* team_by_account(const std::string& account) const;
  bool is_admin(const Identity& who) const;
  // Admins see every team; others the teams they belong to or approve for.
  bool sees_team(const Identity& who, const Team& team) const;
  // The first pool whose tiers list `tier`, or null.
  const Pool* pool_for_tier(const std::string& tier) const;
  const Pool* pool_by_partition(const std::string& partition) const;
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
// Whether `inner` is the directory `outer` or below it; both absolute and lexically normal. Compared by
// components, so /srv/team-ab is not within /srv/team-a.
bool path_within(const std::string& inner, const std::string& outer);

// Seconds -> Slurm's "D-HH:MM:SS" / "HH:MM:SS".
std::string format_wall_time(int64_t seconds);
// Seconds -> "40:00:00": hours not folded into days, the form people write --time in (Slurm reads it too).
std::string format_hours(int64_t seconds);

const char* period_name(Period p);
// [start, end) of the period containing `now` (Unix seconds, UTC).
std::pair<int64_t, int64_t> period_bounds(Period p, int64_t now);

}  // namespace forge::quota
