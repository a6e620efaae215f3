#include "plugin.h"

#include <sys/stat.h>

#include <ctime>

namespace forge::spank {
namespace {

enum Opt { kTeam = 1, kTier, kLayout, kSpec, kApproval };

// Values longer than this are kept truncated (still rejected later): an option callback must not fail
// in remote context, and nothing legitimate is this long.
constexpr size_t kMaxValue = 4096;

int on_option(int val, const char* optarg, int /*remote*/) {
  std::string v = optarg ? optarg : "";
  if (v.size() > kMaxValue) v.resize(kMaxValue);
  OptionValues& o = options();
  // Assignment, not append: Slurm may run a callback twice for the same option.
  switch (val) {
    case kTeam:
      o.team = v;
      break;
    case kTier:
      o.tier = v;
      break;
    case kLayout:
      o.layout = v;
      break;
    case kSpec:
      o.spec = v;
      break;
    case kApproval:
      o.approval = v;
      break;
    default:
      break;
  }
  return 0;
}

struct spank_option kOptions[] = {
    {const_cast<char*>("train-team"), const_cast<char*>("TEAM"),
     const_cast<char*>("Team the training job is charged to (forge policy)."), 1, kTeam, on_option},
    {const_cast<char*>("train-tier"), const_cast<char*>("TIER"),
     const_cast<char*>("Tier: pretrain, finetune or explore (forge policy)."), 1, kTier, on_option},
    {const_cast<char*>("train-layout"), const_cast<char*>("tpX,ppY,dpZ"),
     const_cast<char*>("Parallel layout; tp*cp*dp*pp GPUs."), 1, kLayout, on_option},
    {const_cast<char*>("train-spec"), const_cast<char*>("FILE"),
     const_cast<char*>("Job spec: [parallel] must match --train-layout, [model] fit it."), 1, kSpec,
     on_option},
    {const_cast<char*>("train-approval"), const_cast<char*>("ID"),
     const_cast<char*>("Approval of a large request (forge-quota request / approve)."), 1, kApproval,
     on_option},
};

}  // namespace

OptionValues& options() {
  static OptionValues values;
  return values;
}

State& state() {
  static State s;
  return s;
}

int register_options(spank_t sp) {
  for (auto& opt : kOptions)
    if (spank_option_register(sp, &opt) != ESPANK_SUCCESS) {
      slurm_error("forge: cannot register --%s", opt.name);
      return -1;
    }
  return 0;
}

// A snapshot anyone could have written says nothing: it must belong to root or to the policy's owner
// (who runs `forge-quota sync`) and not be writable by others.
std::optional<std::string> untrusted(const std::string& path, const std::string& policy_path) {
  struct stat snap {
  }, pol{};
  if (::stat(path.c_str(), &snap) != 0) return std::nullopt;  // read_snapshot reports it
  if (::stat(policy_path.c_str(), &pol) != 0) pol.st_uid = 0;
  if (snap.st_uid != 0 && snap.st_uid != pol.st_uid)
    return "usage snapshot '" + path + "' is not owned by root or the policy's owner";
  if (snap.st_mode & (S_IWGRP | S_IWOTH))
    return "usage snapshot '" + path + "' is writable by group or others";
  return std::nullopt;
}

void load_usage(const quota::Policy& policy, const PluginConfig& config, LoadedUsage& out) {
  const std::string path = config.snapshot_path.empty() ? policy.snapshot_path : config.snapshot_path;
  std::string why;
  out.view = {};
  out.view.on_problem = config.on_snapshot_problem;
  if (const auto bad = untrusted(path, config.policy_path)) {
    out.snapshot.reset();
    out.view.problem = *bad;
    return;
  }
  out.snapshot = quota::read_snapshot(path, &why);
  if (!out.snapshot) {
    out.view.problem = why;
    return;
  }
  if (const auto stale =
          quota::snapshot_staleness(*out.snapshot, policy, static_cast<int64_t>(time(nullptr))))
    out.view.problem = *stale + " (" + path + ")";
  else
    out.view.snapshot = &*out.snapshot;
}

namespace {

// A relative path as the job sees it: against the job's working directory (PWD in its environment, else
// the submit directory). In sbatch (no job environment yet) it stays relative: the submitter's directory.
std::string job_path(spank_t sp, const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  char dir[4096] = "";
  if (spank_getenv(sp, "PWD", dir, sizeof dir) != ESPANK_SUCCESS &&
      spank_getenv(sp, "SLURM_SUBMIT_DIR", dir, sizeof dir) != ESPANK_SUCCESS)
    return path;
  return std::string(dir) + "/" + path;
}

}  // namespace

std::optional<std::string> run_dir_problem(spank_t sp, const quota::Policy& policy, const quota::Team& team,
                                           const quota::Identity& who,
                                           const quota::SpecLayout* already_read) {
  const std::string& spec = options().spec;
  if (team.root.empty() || spec.empty() || policy.is_admin(who)) return std::nullopt;
  std::string why;
  const auto declared =
      already_read ? std::optional(*already_read) : quota::read_spec_layout(job_path(sp, spec), &why);
  if (!declared) return "--train-spec: " + why;
  if (declared->run_dir.empty())
    return "--train-spec " + spec + " sets no [run] dir; set it under " + team.root + "/runs";
  return quota::run_dir_violation(policy, team, who, job_path(sp, declared->run_dir));
}

}  // namespace forge::spank
