// The entry points Slurm looks up by name. spank.h declares them outside its extern "C" block, so they
// are defined here with C linkage; each routes by spank_context() to the file for that context. The
// linker version script (forge_spank.map) exports these and the plugin_* symbols, nothing else.
#include "plugin.h"

#include <slurm/slurm_version.h>

#include <string>

extern "C" {
extern const char plugin_name[] = "forge";
extern const char plugin_type[] = "spank";
extern const unsigned int plugin_version = SLURM_VERSION_NUMBER;
extern const unsigned int spank_plugin_version = 1;
}

using namespace forge::spank;

// Registers the options (sbatch/salloc ignore a static spank_options table) and reads plugstack.conf.
// Never fails in remote context: a failure there could drain the node.
int slurm_spank_init(spank_t sp, int ac, char** av) {
  State& s = state();
  s.config = parse_config(ac, av, &s.config_error);
  const spank_context_t ctx = spank_context();
  if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE) {
    const int rc = register_options(sp);
    if (rc != 0 && ctx != S_CTX_REMOTE) return rc;
  }
  return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int, char**) {
  switch (spank_context()) {
    case S_CTX_ALLOCATOR:
      return alloc_init_post_opt(sp);
    case S_CTX_LOCAL:
      return srun_init_post_opt(sp);
    default:
      return 0;  // remote: the decision waits for user_init, the verdict for task_init_privileged
  }
}

int slurm_spank_user_init(spank_t sp, int, char**) {
  return spank_context() == S_CTX_REMOTE ? stepd_user_init(sp) : 0;
}

int slurm_spank_task_init_privileged(spank_t sp, int, char**) {
  if (spank_context() != S_CTX_REMOTE) return 0;
  const int rc = stepd_task_init_privileged(sp);
  return rc != 0 ? rc : stepd_enter_job_tmp(sp);
}

// The epilog (slurmd's `slurmstepd spank epilog`) reads its configuration from its own arguments: the state
// slurm_spank_init fills was found empty there. It must never fail (a failed epilog drains the node).
int slurm_spank_job_epilog(spank_t sp, int ac, char** av) {
  if (spank_context() != S_CTX_JOB_SCRIPT) return 0;
  std::string why;
  if (const auto config = parse_config(ac, av, &why)) job_epilog_remove_job_tmp(sp, *config);
  return 0;
}
