// slurmstepd (remote context): the re-check against the real allocation. The --train-* values arrive as
// _SLURM_SPANK_OPTION_* variables the user controls, so they are validated again against the policy on
// the node and compared with the job record from slurmctld (GPUs, nodes, QOS, account, partition,
// switches, time).
//
// A rejection must never drain the node (FIELD-NOTES): errors from init_post_opt or user_init in the
// batch step drain it, an error from task_init_privileged fails only the job. So user_init decides and
// never fails; task_init_privileged (run in each task's child of this slurmstepd) reports the verdict.
#include "plugin.h"

#include "forge/common/text.h"
#include "forge/quota/usage.h"

extern "C" {
#include <slurm/slurm.h>
}

#include <ctime>

namespace forge::spank {
namespace {

struct Verdict {
  bool reject = false;
  std::string message;
};

Verdict& verdict() {
  static Verdict v;
  return v;
}

// The job record from slurmctld: the allocation as Slurm made it.
std::optional<quota::Allocation> load_allocation(uint32_t job_id, std::string* why) {
  job_info_msg_t* msg = nullptr;
  if (slurm_load_job(&msg, job_id, SHOW_DETAIL) != SLURM_SUCCESS || !msg || msg->record_count < 1) {
    *why = "cannot load the job record from slurmctld: " + std::string(slurm_strerror(slurm_get_errno()));
    if (msg) slurm_free_job_info_msg(msg);
    return std::nullopt;
  }
  const slurm_job_info_t& job = msg->job_array[0];
  quota::Allocation a;
  a.nodes = static_cast<int>(job.num_nodes);
  a.gpus = quota::gpus_in_tres(job.tres_alloc_str ? job.tres_alloc_str : "");
  a.qos = job.qos ? job.qos : "";
  a.account = job.account ? job.account : "";
  a.req_switches = job.req_switch == NO_VAL ? 0 : static_cast<int>(job.req_switch);
  a.partition = job.partition ? job.partition : "";
  // The AdminComment's words (only root and the controller write it): job_submit.lua marks an elastic
  // job "forge-elastic:nodes=A-B".
  for (const std::string& word : split_list(job.admin_comment ? job.admin_comment : "", ' '))
    a.elastic = a.elastic || word.rfind("forge-elastic:nodes=", 0) == 0;
  // INFINITE: no limit at all, which no tier allows.
  a.time_limit_s = job.time_limit == INFINITE || job.time_limit == NO_VAL
                       ? INT64_MAX / 2
                       : static_cast<int64_t>(job.time_limit) * 60;
  slurm_free_job_info_msg(msg);
  return a;
}

}  // namespace

int stepd_user_init(spank_t sp) {
  verdict() = {};
  const OptionValues& o = options();
  if (!o.any()) return 0;
  uint32_t job_id = 0;
  uid_t uid = 0;
  spank_get_item(sp, S_JOB_ID, &job_id);
  spank_get_item(sp, S_JOB_UID, &uid);
  const auto refuse = [&](const std::string& why) {
    verdict() = {true, "forge: job " + std::to_string(job_id) + " rejected at start: " + why};
    slurm_error("%s", verdict().message.c_str());  // to the node's log now; the job fails in task init
    return 0;
  };
  if (!state().config) return refuse(state().config_error);
  try {
    const quota::Policy policy = quota::load_policy(state().config->policy_path);
    std::string why;
    const auto alloc = load_allocation(job_id, &why);
    if (!alloc) return refuse(why);
    LoadedUsage usage;
    load_usage(policy, *state().config, usage);
    const quota::Identity who = quota::identity_of_uid(uid);
    const quota::Decision d =
        quota::check_allocation(policy, {o.team, o.tier, o.layout, {}}, who, *alloc, usage.view);
    for (const auto& w : d.warnings) slurm_info("forge: job %u: warning: %s", job_id, w.c_str());
    if (!d.allowed) return refuse(d.message);
    if (const auto bad = run_dir_problem(sp, policy, *d.team, who)) return refuse(*bad);
    spank_setenv(sp, "FORGE_TEAM", d.team->name.c_str(), 1);
    spank_setenv(sp, "FORGE_TIER", d.tier->name.c_str(), 1);
    spank_setenv(sp, "FORGE_LAYOUT", d.layout.str().c_str(), 1);
    spank_setenv(sp, "FORGE_PREEMPTIBLE", d.tier->preemptible ? "1" : "0", 1);
  } catch (const std::exception& e) {
    return refuse(std::string("cannot check the allocation: ") + e.what());
  }
  return 0;
}

int stepd_task_init_privileged(spank_t) {
  if (!verdict().reject) return 0;
  if (state().config && !state().config->enforce) return 0;  // mode=warn: logged in user_init
  slurm_error("%s", verdict().message.c_str());
  return -1;
}

}  // namespace forge::spank
