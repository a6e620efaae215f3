// srun (local context). Inside an allocation a step belongs to a job that was already admitted (and is
// re-checked by slurmstepd); an srun that creates its own allocation is a submission like sbatch.
#include "plugin.h"

#include <cstdlib>

namespace forge::spank {

int srun_init_post_opt(spank_t sp) {
  if (std::getenv("SLURM_JOB_ID") != nullptr) return 0;
  return admit_local(sp, "srun");
}

}  // namespace forge::spank
