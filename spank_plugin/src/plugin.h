// Internals shared by the plugin's files (the pyxis shape): dispatch.cpp routes each SPANK callback by
// context to alloc.cpp (sbatch/salloc), srun.cpp (srun) or stepd.cpp (slurmstepd); args.cpp holds the
// --train-* options, config.cpp the plugstack.conf arguments. The policy logic is forge_quota_core's.
#pragma once

#include "forge/quota/admission.h"
#include "forge/quota/identity.h"

// spank.h declares the slurm_spank_* callbacks outside its own extern "C" block: included bare from C++
// they would get C++ linkage and Slurm could not find them by name.
extern "C" {
#include <slurm/spank.h>
}

#include <optional>
#include <string>

namespace forge::spank {

// plugstack.conf: `required|optional forge_spank.so policy=PATH [snapshot=PATH] [mode=enforce|warn]
// [fail-open|fail-closed] [job_tmp=DIR]`.
struct PluginConfig {
  std::string policy_path = "/etc/forge/quota.ini";
  std::string snapshot_path;  // empty: the policy's [policy] snapshot
  std::string job_tmp;        // root's directory on each node for the jobs' private /tmp; empty: none
  bool enforce = true;        // warn: report what would be rejected, reject nothing
  quota::SnapshotFailure on_snapshot_problem = quota::SnapshotFailure::kOpen;
};

// Parses the plugstack arguments; nullopt with `why` set on an unknown or malformed argument.
std::optional<PluginConfig> parse_config(int ac, char** av, std::string* why);

// The options as given (raw, untrusted). Filled by the option callbacks, which may run more than once.
struct OptionValues {
  std::string team, tier, layout, spec, approval;
  bool any() const {
    return !team.empty() || !tier.empty() || !layout.empty() || !spec.empty() || !approval.empty();
  }
};
OptionValues& options();
int register_options(spank_t sp);

// What the plugin knows once slurm_spank_init has run.
struct State {
  std::optional<PluginConfig> config;
  std::string config_error;
};
State& state();

// The usage view for a decision: the snapshot if it is readable and fresh, else why not.
struct LoadedUsage {
  std::optional<quota::UsageSnapshot> snapshot;
  quota::UsageView view;
};
void load_usage(const quota::Policy& policy, const PluginConfig& config, LoadedUsage& out);

// A team with a directory keeps its runs there (docs/ADMISSION.md, "Team isolation"): the run.dir of the
// job's --train-spec must lie under it (admins exempt; a job without --train-spec declares no run, and
// scripts/sbatch/submit-pipeline always gives it). In slurmstepd user_init runs with the job user's
// privileges: the spec is read as they would read it. `already_read`: the spec when the caller read it.
std::optional<std::string> run_dir_problem(spank_t sp, const quota::Policy& policy, const quota::Team& team,
                                           const quota::Identity& who,
                                           const quota::SpecLayout* already_read = nullptr);

// Shared by sbatch/salloc and an allocating srun: the submission check. 0 to go on, -1 to reject.
int admit_local(spank_t sp, const char* tool);

int alloc_init_post_opt(spank_t sp);
int srun_init_post_opt(spank_t sp);
int stepd_user_init(spank_t sp);
int stepd_task_init_privileged(spank_t sp);
// job_tmp.cpp: the task enters the job's private /tmp and /dev/shm; the job's epilog removes them.
int stepd_enter_job_tmp(spank_t sp);
void job_epilog_remove_job_tmp(spank_t sp, const PluginConfig& config);

}  // namespace forge::spank
