// A stand-in for the host process (sbatch, srun, slurmstepd) that loads forge_spank.so: the spank_*
// and slurm_* functions the plugin calls, recording what it does. The test binary exports them
// (ENABLE_EXPORTS) so the dlopen'ed plugin binds to these.
#pragma once

extern "C" {
#include <slurm/slurm.h>
#include <slurm/spank.h>
}

#include <map>
#include <string>
#include <vector>

namespace fake {

struct Host {
  spank_context_t context = S_CTX_ALLOCATOR;
  std::vector<spank_option> options;
  std::vector<std::string> errors, infos, formats;
  std::map<std::string, std::string> control_env, job_env;
  uint32_t job_id = 42;
  uid_t uid = 0;
  gid_t gid = 0;
  bool job_loads = true;
  // The job record slurm_load_job returns.
  uint32_t num_nodes = 1, req_switch = 0, time_limit = 60;
  std::string tres = "cpu=1,gres/gpu=8,node=1", qos = "pretrain", account = "team-a", admin_comment;
};

Host& host();
void reset(spank_context_t context);

}  // namespace fake
