// sbatch / salloc (allocator context): the early, friendly answer. The plugin sees only its own
// options and the user, not the request, so the real locks are server-side (Slurm limits,
// job_submit.lua, the slurmstepd re-check); this check tells the user what to change before they wait.
#include "plugin.h"

#include <unistd.h>

#include <ctime>

namespace forge::spank {
namespace {

void set_control_env(spank_t sp, const quota::Policy& policy, const quota::Decision& d) {
  const auto put = [&](const char* name, const std::string& value) {
    spank_job_control_setenv(sp, name, value.c_str(), 1);
  };
  // job_submit.lua reads these from job_desc.spank_job_env and checks the real request against them.
  put("FORGE_TEAM", d.team->name);
  put("FORGE_TIER", d.tier->name);
  put("FORGE_LAYOUT", d.layout.str());
  put("FORGE_PREEMPTIBLE", d.tier->preemptible ? "1" : "0");
  put("FORGE_QOS", d.tier->qos);
  put("FORGE_ACCOUNT", d.team->account);
  put("FORGE_GPUS", std::to_string(d.layout.world()));
  put("FORGE_NODES", std::to_string(quota::nodes_for(d.layout, policy.topology)));
  put("FORGE_GPUS_PER_NODE", std::to_string(policy.topology.gpus_per_node));
  put("FORGE_MAX_SWITCHES", std::to_string(policy.topology.switches_for(d.layout.world())));
  put("FORGE_MAX_WALL_MIN", std::to_string(d.tier->max_wall_s / 60));
  // Only named here; job_submit.lua has the controller's checker look it up in the approval store.
  if (!options().approval.empty()) put("FORGE_APPROVAL", options().approval);
}

}  // namespace

int admit_local(spank_t sp, const char* tool) {
  const OptionValues& o = options();
  if (!o.any()) return 0;  // not a training job: Slurm's own limits apply as usual
  const bool enforce = !state().config || state().config->enforce;
  const auto reject = [&](const std::string& why) {
    const std::string msg = "forge: " + why;
    if (!enforce) {
      slurm_info("%s (mode=warn: submitted anyway)", msg.c_str());
      return 0;
    }
    slurm_error("%s", msg.c_str());
    return -1;
  };
  if (!state().config) return reject(state().config_error);
  try {
    const quota::Policy policy = quota::load_policy(state().config->policy_path);
    quota::Choices choices{o.team, o.tier, o.layout, {}};
    if (!o.spec.empty()) {
      std::string why;
      choices.spec = quota::read_spec_layout(o.spec, &why);
      if (!choices.spec) return reject("--train-spec: " + why);
    }
    LoadedUsage usage;
    load_usage(policy, *state().config, usage);
    const quota::Identity who = quota::identity_of_uid(getuid());
    const quota::Decision d = quota::admit_submission(policy, choices, who, usage.view);
    for (const auto& w : d.warnings) slurm_info("forge: warning: %s", w.c_str());
    if (!d.allowed) return reject(d.message);
    if (const auto bad = run_dir_problem(sp, policy, *d.team, who, choices.spec ? &*choices.spec : nullptr))
      return reject(*bad);
    // The early word on approval: sbatch does not see --time, so only the GPU and tier rules are judged
    // here; the controller judges all of them and whether the approval is valid.
    if (o.approval.empty())
      if (const auto why = quota::approval_needed(policy, *d.tier, d.layout.world(), std::nullopt))
        return reject(
            quota::approval_missing_message(*why, *d.team, *d.tier, d.layout.world(), std::nullopt));
    set_control_env(sp, policy, d);
    return 0;
  } catch (const std::exception& e) {
    return reject(std::string("cannot check this ") + tool + " submission: " + e.what());
  }
}

int alloc_init_post_opt(spank_t sp) {
  return admit_local(sp, "sbatch/salloc");
}

}  // namespace forge::spank
