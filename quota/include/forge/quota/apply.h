// `forge-quota apply`: the policy written into Slurm's own limits with sacctmgr — one QOS per tier
// (Priority, Preempt, PreemptMode=requeue, GraceTime, Flags=DenyOnLimit, UsageFactor, MaxWall) and one
// account per team (GrpTRESMins=gres/gpu=budget*60, GrpTRES=gres/gpu=max_gpus, the tiers' QOS).
// The plan is a diff against what `sacctmgr show` reports, so applying twice changes nothing.
#pragma once

#include "forge/quota/policy.h"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace forge::quota {

struct QosState {
  int priority = 0;
  std::set<std::string> preempt;
  std::string preempt_mode;  // lower case: "cluster", "requeue", ...
  int64_t grace_s = 0;
  std::set<std::string> flags;
  double usage_factor = 1.0;
  int64_t max_wall_s = 0;  // 0 = none
};

struct AssocState {
  std::string grp_tres_mins;  // as sacctmgr prints it, e.g. "gres/gpu=1200000"
  std::string grp_tres;
  std::set<std::string> qos;
};

struct SlurmState {
  std::map<std::string, QosState> qos;
  std::map<std::string, AssocState> accounts;                       // account associations
  std::map<std::pair<std::string, std::string>, AssocState> users;  // (account, user)
};

// The sacctmgr commands `apply` runs to read the state (argv without the program name).
std::vector<std::string> show_qos_args();
std::vector<std::string> show_assoc_args(const std::string& cluster);

// Parses the output of those two commands (--parsable2 --noheader).
SlurmState parse_slurm_state(const std::string& qos_text, const std::string& assoc_text);

// sacctmgr argument lists (after "sacctmgr -i") that bring Slurm to the policy; empty when it is there.
std::vector<std::vector<std::string>> plan_apply(const Policy& policy, const SlurmState& state);

// A command as a shell-quoted line, for --dry-run.
std::string shell_line(const std::vector<std::string>& argv);

}  // namespace forge::quota
