// A private /tmp and /dev/shm for every job on every node (plugstack `job_tmp=DIR`; docs/ADMISSION.md,
// "Private job scratch"). Each task of a job enters a mount namespace of its own, in which DIR/<job>/tmp and
// DIR/<job>/shm are bound over /tmp and /dev/shm, so every task and step of the job on a node sees the same
// two directories and no other job sees them; the job's epilog removes DIR/<job>.
//
// Why not Slurm 22.05's job_container/tmpfs, which does the same from the job's extern step: slurmd runs
// the prolog (and so makes the extern step and the namespace) once per job id within a credential's
// lifetime, so a job requeued onto the same node within two minutes, as forge's restarts are, starts
// without its namespace and its batch step fails at once.
//
// Both callbacks run as root: task_init_privileged in the task's child of slurmstepd before it becomes the
// job's user (a failure fails the job, never drains the node), job_epilog in the node's epilog (it must not
// fail: a failed epilog drains the node).
#include "plugin.h"

#include <fmt/format.h>

#include <ftw.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace forge::spank {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// PATH is root's directory (not a link) with none of the `forbidden` mode bits and, if `exact` is set,
// exactly that mode.
std::optional<std::string> dir_problem(const std::string& path, mode_t forbidden, mode_t exact = 0) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return path + ": " + errno_text();
  if (!S_ISDIR(st.st_mode)) return path + " is not a directory";
  if (st.st_uid != 0) return path + " belongs to uid " + std::to_string(st.st_uid) + ", not root";
  const mode_t mode = st.st_mode & 07777;
  if ((mode & forbidden) != 0 || (exact != 0 && mode != exact))
    return fmt::format("{} has mode {:04o}, expected {}", path, mode,
                       exact != 0 ? fmt::format("{:04o}", exact) : fmt::format("none of {:04o}", forbidden));
  return std::nullopt;
}

int remove_entry(const char* path, const struct stat*, int, FTW*) {
  ::remove(path);
  return 0;
}

void remove_tree(const std::string& path) {
  // FTW_PHYS: links are removed, never followed; FTW_MOUNT: nothing on another file system.
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

// /tmp and /dev/shm as every program expects them: anyone's, sticky. They are private through the job's
// namespace, not their mode; a root job's code sandbox, as nobody, needs the usual mode to reach its scratch.
constexpr mode_t kScratchMode = 01777;

// DIR/<job> with tmp/ and shm/ inside, made whole under a temporary name and renamed into place, so that a
// task never sees it half made; the first task of the job on the node makes it, the others find it.
std::optional<std::string> make_job_dir(const std::string& job_dir) {
  if (::access(job_dir.c_str(), F_OK) == 0) return std::nullopt;
  std::string staging = job_dir + ".new-XXXXXX";
  if (!::mkdtemp(staging.data())) return "cannot make " + staging + ": " + errno_text();
  for (const char* sub : {"/tmp", "/shm"}) {
    const std::string d = staging + sub;
    if (::mkdir(d.c_str(), 0700) != 0 || ::chmod(d.c_str(), kScratchMode) != 0) {
      const std::string why = "cannot make " + d + ": " + errno_text();
      remove_tree(staging);
      return why;
    }
  }
  if (::rename(staging.c_str(), job_dir.c_str()) != 0) {
    const int err = errno;
    remove_tree(staging);
    if (err != EEXIST && err != ENOTEMPTY) return "cannot make " + job_dir + ": " + std::strerror(err);
  }
  return std::nullopt;
}

std::optional<std::string> enter(const std::string& base, uint32_t job_id) {
  if (auto bad = dir_problem(base, 022)) return "job_tmp: " + *bad;
  const std::string job_dir = base + "/" + std::to_string(job_id);
  if (auto bad = make_job_dir(job_dir)) return bad;
  // The job may write tmp/ and shm/, never the directory that holds them: what is bound below is what this
  // task made or checked, not a link the job put there.
  if (auto bad = dir_problem(job_dir, 077)) return bad;
  for (const char* sub : {"/tmp", "/shm"})
    if (auto bad = dir_problem(job_dir + sub, 0, kScratchMode)) return bad;
  if (::unshare(CLONE_NEWNS) != 0) return "unshare(CLONE_NEWNS): " + errno_text();
  // Slave: mounts made on the node still reach the job; the job's two binds never reach the node.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0)
    return "making / a slave mount: " + errno_text();
  for (const auto& [from, to] :
       {std::pair{job_dir + "/tmp", "/tmp"}, std::pair{job_dir + "/shm", "/dev/shm"}})
    if (::mount(from.c_str(), to, nullptr, MS_BIND, nullptr) != 0)
      return "binding " + from + " on " + to + ": " + errno_text();
  return std::nullopt;
}

}  // namespace

int stepd_enter_job_tmp(spank_t sp) {
  if (!state().config || state().config->job_tmp.empty()) return 0;
  uint32_t job_id = 0;
  if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS) {
    slurm_error("forge: private /tmp: cannot read the job's id from Slurm");
    return -1;
  }
  if (const auto bad = enter(state().config->job_tmp, job_id)) {
    slurm_error("forge: job %u: cannot give it a private /tmp and /dev/shm: %s", job_id, bad->c_str());
    return -1;
  }
  return 0;
}

void job_epilog_remove_job_tmp(spank_t sp, const PluginConfig& config) {
  if (config.job_tmp.empty()) return;
  uint32_t job_id = 0;
  if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS || job_id == 0) {
    const char* env = std::getenv("SLURM_JOB_ID");
    job_id = env ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : 0;
  }
  if (job_id != 0) remove_tree(config.job_tmp + "/" + std::to_string(job_id));
}

}  // namespace forge::spank
