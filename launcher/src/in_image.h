// forge-train in-image IMAGE PROGRAM [ARGS...]: runs one task of a Slurm step inside a container image (an
// OCI bundle made by forge-image build; docs/IMAGES.md) through the runtime command of the node's oci.conf,
// as slurmstepd does for `srun --container`, which in Slurm 22.05 refuses a step with more than one task
// on a node. The batch scripts start every rank this way when the spec names run.image. It waits for the
// runtime, passing Slurm's signals on, and removes the task's bundle directory when the runtime ends.
#pragma once

#include "forge/common/json.h"

#include <string>
#include <vector>

namespace forge::launcher {

// What oci.conf's patterns stand for (oci.conf(5)): the node, the user and uid, the job, step and task.
struct TaskIds {
  std::string node, user, uid, job, step, task;
  static TaskIds from_environment();  // SLURMD_NODENAME, SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID
};

// The runtime spec of one task: the image's config.json with the task's arguments, its environment (the
// image's own entries win, as slurmstepd merges them), its working directory, the absolute rootfs, and
// the user: the same uid and gid inside as outside (a user namespace mapping only them), because the
// PMIx server of the step and the files of the run check who the rank is.
Json task_config(const Json& image_config, const std::string& image_dir, const std::vector<std::string>& args,
                 const std::vector<std::string>& env, const std::string& cwd, unsigned uid, unsigned gid);

// oci.conf's RunTimeRun with the patterns filled in: %b the task's bundle, %r the rootfs, %n %u %U %j %s
// %t, %% a percent sign. kUsage for a pattern Slurm has and this does not (%@, %e, %m, %p).
std::string runtime_command(const std::string& pattern, const std::string& bundle, const std::string& rootfs,
                            const TaskIds& ids);

// RunTimeRun of the oci.conf at `path`; kUsage naming the file when it is missing or names none.
std::string oci_run_pattern(const std::string& path);

// Whether a host path is visible at the same path inside the image: under one of its bind mounts.
bool visible_in_image(const Json& image_config, const std::string& path);

int in_image_command(int argc, char** argv);

}  // namespace forge::launcher
