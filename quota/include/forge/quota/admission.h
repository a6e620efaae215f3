// Admission decisions: the policy logic behind the SPANK plugin, free of Slurm so it is unit-tested.
// Two moments: at submission (sbatch/salloc: the user's declared choices, nothing of the real request)
// and at job start (slurmstepd: the real allocation, which must match what was declared).
#pragma once

#include "forge/quota/layout.h"
#include "forge/quota/policy.h"
#include "forge/quota/snapshot.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace forge::quota {

// What the user declared with --train-team/--train-tier/--train-layout (raw, untrusted text).
struct Choices {
  std::string team, tier, layout;
  std::optional<SpecLayout> spec;  // what --train-spec declares, when given
};

enum class SnapshotFailure { kOpen, kClosed };

// The usage the decision sees: the snapshot when it is readable and fresh, else why it is not.
struct UsageView {
  const UsageSnapshot* snapshot = nullptr;
  std::string problem;  // set when snapshot is null or stale
  SnapshotFailure on_problem = SnapshotFailure::kOpen;
};

// The real allocation of a started job (remote context).
struct Allocation {
  int nodes = 0;
  int gpus = 0;  // total GPUs allocated to the job
  std::string qos;
  std::string account;
  int req_switches = 0;      // the job's switch limit (0 = none)
  int64_t time_limit_s = 0;  // 0 = unknown
  std::string partition;     // where it runs (empty = not checked)
  // A node range admitted by job_submit.lua (AdminComment "forge-elastic:nodes=A-B", which only root and
  // the controller write): the job may run on fewer whole nodes than its layout (parallel.elastic).
  bool elastic = false;
};

struct Decision {
  bool allowed = false;
  std::string message;                // the rejection, one actionable sentence
  std::vector<std::string> warnings;  // shown but not fatal (e.g. fail-open on a stale snapshot)
  const Team* team = nullptr;
  const Tier* tier = nullptr;
  Layout layout;
};

// Decision at sbatch/salloc time. The quota check charges the job its declared GPUs for the tier's
// whole max wall time: used + reserved + gpus * max_wall * charge <= budget.
Decision admit_submission(const Policy& policy, const Choices& choices, const Identity& who,
                          const UsageView& usage);

// Decision at job start: everything admit_submission checks except the reservation arithmetic, plus the
// real allocation against the declared layout and tier (GPUs, nodes, QOS, account, partition, switches,
// time).
Decision check_allocation(const Policy& policy, const Choices& choices, const Identity& who,
                          const Allocation& alloc, const UsageView& usage);

// Pools ([pool.*]): nullopt when a job of `tier` may run in `partition` (a comma-separated list, as Slurm
// takes; empty: filled in with the first pool that takes the tier), else the rejection naming the
// partitions that would do. Without pools every partition does.
std::optional<std::string> pool_problem(const Policy& policy, const Tier& tier, std::string& partition);

// Approval of large requests ([approval]): the reason a job of `gpus` GPUs in `tier` needs one, in words,
// or nullopt when no rule holds. The GPU-hour rule (GPUs x time limit) is skipped when the time limit is
// unknown (nullopt).
std::optional<std::string> approval_needed(const Policy& policy, const Tier& tier, int gpus,
                                           std::optional<int64_t> time_limit_s);

// The command a user runs to ask for that approval: "forge-quota request --team T --tier X --gpus N
// --time H:MM:SS --reason "..."" (the job's time limit, else the tier's max wall).
std::string approval_request_command(const Team& team, const Tier& tier, int gpus,
                                     std::optional<int64_t> time_limit_s);

// The rejection of a job that needs an approval and names none (`reason`: approval_needed's), the same
// words from sbatch's plugin and from the controller.
std::string approval_missing_message(const std::string& reason, const Team& team, const Tier& tier, int gpus,
                                     std::optional<int64_t> time_limit_s);

// Team isolation: nullopt when `run_dir` is allowed — the team has no root, `who` is an admin, or the
// directory (absolute, normalised, symlinks resolved as far as it exists) lies within the team's root.
// Else the sentence to show: "run.dir '/tmp/x' is outside team team-a's directory ...; put the run under
// .../runs".
std::optional<std::string> run_dir_violation(const Policy& policy, const Team& team, const Identity& who,
                                             const std::string& run_dir);

}  // namespace forge::quota
