#include "forge/quota/admission.h"

#include "forge/common/text.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

namespace forge::quota {
namespace {

std::string teams_of(const Policy& policy, const Identity& who) {
  std::string out;
  for (const auto& [name, team] : policy.teams)
    if (team.has_member(who.user, who.groups)) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "none" : out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

Decision reject(std::string message) {
  Decision d;
  d.message = std::move(message);
  return d;
}

// Checks shared by both moments: the choices are present and well-formed, the team exists and has the
// user, the tier is allowed, the layout parses and obeys the topology and the team's GPU cap, and a job
// spec, when given, declares the same layout and a model the layout can split.
Decision check_choices(const Policy& policy, const Choices& c, const Identity& who) {
  if (c.team.empty() || c.tier.empty() || c.layout.empty()) {
    std::vector<std::string> missing;
    if (c.team.empty()) missing.push_back("--train-team");
    if (c.tier.empty()) missing.push_back("--train-tier");
    if (c.layout.empty()) missing.push_back("--train-layout");
    return reject(
        fmt::format("missing {}: a training job declares its team, tier and layout together, "
                    "e.g. --train-team=TEAM --train-tier=TIER --train-layout=tp2,pp1,dp4",
                    join(missing)));
  }
  const Team* team = policy.team(c.team);
  if (!team)
    return reject(fmt::format("unknown team '{}' (--train-team); teams in the policy: {}", printable(c.team),
                              policy.team_names()));
  if (!team->has_member(who.user, who.groups))
    return reject(
        fmt::format("user '{}' is not a member of team '{}'; submit for a team you belong to ({}) or ask the "
                    "administrators to add you to [team.{}] members in {}",
                    printable(who.user), team->name, teams_of(policy, who), team->name, policy.path));
  const Tier* tier = policy.tier(c.tier);
  if (!tier)
    return reject(fmt::format("unknown tier '{}' (--train-tier); tiers in the policy: {}", printable(c.tier),
                              policy.tier_names()));
  if (!team->allows_tier(tier->name))
    return reject(fmt::format("team '{}' may not use tier '{}'; its tiers are: {} (change --train-tier)",
                              team->name, tier->name, join(team->tiers)));
  std::string why;
  const auto layout = parse_layout(c.layout, &why);
  if (!layout) return reject(fmt::format("--train-layout: {}", why));
  if (const auto v = topology_violation(*layout, policy.topology))
    return reject(fmt::format("--train-layout={}: {}", layout->str(), *v));
  if (layout->world() > team->max_gpus)
    return reject(
        fmt::format("--train-layout={} needs {} GPUs but team '{}' may hold at most {} at once; "
                    "lower dp or pp",
                    layout->str(), layout->world(), team->name, team->max_gpus));
  if (c.spec && !(c.spec->layout == *layout))
    return reject(
        fmt::format("--train-layout={} disagrees with the job spec's [parallel] ({}); make them "
                    "the same",
                    layout->str(), c.spec->layout.str()));
  // The trainer makes the same check (forge::layout_problem); here it fails in sbatch, not after the wait.
  if (c.spec)
    if (const auto p = layout_problem(*layout, c.spec->model))
      return reject(
          fmt::format("--train-layout={} does not suit the job spec: {}: {}", layout->str(), p->key, p->why));
  Decision d;
  d.allowed = true;
  d.team = team;
  d.tier = tier;
  d.layout = *layout;
  return d;
}

// Applies the snapshot policy: nullopt to go on with the snapshot, else the decision to return.
std::optional<Decision> snapshot_gate(Decision& d, const UsageView& usage) {
  if (usage.snapshot && usage.problem.empty()) return std::nullopt;
  if (usage.on_problem == SnapshotFailure::kClosed)
    return reject(
        fmt::format("{}, so the quota cannot be checked and this cluster refuses jobs until it "
                    "can (fail-closed); ask the administrators to run 'forge-quota sync'",
                    usage.problem));
  d.warnings.push_back(fmt::format("{}; quota not checked (fail-open)", usage.problem));
  return d;
}

}  // namespace

Decision admit_submission(const Policy& policy, const Choices& choices, const Identity& who,
                          const UsageView& usage) {
  Decision d = check_choices(policy, choices, who);
  if (!d.allowed) return d;
  if (auto gate = snapshot_gate(d, usage)) return *gate;
  const auto it = usage.snapshot->teams.find(d.team->name);
  const TeamUsage u = it == usage.snapshot->teams.end() ? TeamUsage{} : it->second;
  const double hours = d.tier->max_wall_s / 3600.0;
  const double need = d.layout.world() * hours * d.tier->charge;
  const double left = d.team->budget_gpu_hours - u.used_gpu_hours - u.reserved_gpu_hours;
  if (need > left + 1e-9) {
    // Suggest the tier of this team that would fit, if any, among those of the same pool (an evaluation
    // tier is no place for a training job).
    std::string fits;
    const Pool* pool = policy.pool_for_tier(d.tier->name);
    for (const auto& name : d.team->tiers) {
      const Tier* t = policy.tier(name);
      if (t && (!pool || pool->allows_tier(t->name)) &&
          d.layout.world() * (t->max_wall_s / 3600.0) * t->charge <= left)
        fits = fmt::format(", or tier '{}' (max wall {}, charge {})", t->name,
                           format_wall_time(t->max_wall_s), t->charge);
    }
    const int max_gpus = static_cast<int>(std::max(0.0, left / (hours * d.tier->charge)));
    return reject(fmt::format(
        "over quota: team '{}' has {:.1f} GPU-hours left this {} (budget {:.1f}, used {:.1f}, reserved "
        "{:.1f}) but this job may use {:.1f} ({} GPUs x {} max wall of tier '{}' x charge {}), over by "
        "{:.1f}; use at most {} GPUs{}, or ask for more budget",
        d.team->name, std::max(0.0, left), period_name(policy.period), d.team->budget_gpu_hours,
        u.used_gpu_hours, u.reserved_gpu_hours, need, d.layout.world(), format_wall_time(d.tier->max_wall_s),
        d.tier->name, d.tier->charge, need - std::max(0.0, left), max_gpus, fits));
  }
  return d;
}

std::optional<std::string> pool_problem(const Policy& policy, const Tier& tier, std::string& partition) {
  if (policy.pools.empty()) return std::nullopt;
  std::vector<std::string> taking;
  for (const auto& p : policy.pools)
    if (p.allows_tier(tier.name)) taking.push_back(p.partition);
  if (taking.empty())
    return fmt::format("no pool of the policy takes tier '{}' jobs; ask the administrators", tier.name);
  if (partition.empty()) {
    partition = policy.pool_for_tier(tier.name)->partition;
    return std::nullopt;
  }
  for (const auto& part : split_list(partition, ',')) {  // Slurm takes a list of partitions
    const Pool* pool = policy.pool_by_partition(part);
    if (!pool)
      return fmt::format(
          "partition '{}' is in no pool of the policy; tier '{}' jobs run in: {} (--partition)",
          printable(part), tier.name, fmt::join(taking, ", "));
    if (!pool->allows_tier(tier.name))
      return fmt::format("partition '{}' (pool {}) does not take tier '{}' jobs; submit to {} (--partition)",
                         part, pool->name, tier.name, fmt::join(taking, ", "));
  }
  return std::nullopt;
}

Decision check_allocation(const Policy& policy, const Choices& choices, const Identity& who,
                          const Allocation& a, const UsageView& usage) {
  Decision d = check_choices(policy, choices, who);
  if (!d.allowed) return d;
  const Layout& l = d.layout;
  const int want_nodes = nodes_for(l, policy.topology);
  // An elastic job (sbatch -N MIN-MAX, which job_submit.lua admits and marks) may run on fewer whole nodes
  // than its layout, down to one model replica: forge-train fits dp to what it got (parallel.elastic).
  const int per_node = l.world() / want_nodes, replica = l.tp * l.cp * l.pp;
  const bool elastic =
      a.elastic && a.nodes > 0 && a.nodes < want_nodes && a.gpus == a.nodes * per_node && a.gpus >= replica;
  if (!elastic && a.gpus != l.world())
    return reject(
        fmt::format("the job was given {} GPUs but --train-layout={} needs tp*cp*dp*pp = {}; submit "
                    "with --gpus-per-node and --nodes that multiply to {}",
                    a.gpus, l.str(), l.world(), l.world()));
  if (!elastic && a.nodes != want_nodes)
    return reject(
        fmt::format("the job runs on {} nodes but --train-layout={} ({} GPUs, {} per node) needs "
                    "{}; submit with --nodes={}",
                    a.nodes, l.str(), l.world(), policy.topology.gpus_per_node, want_nodes, want_nodes));
  if (a.nodes > 0 && (a.gpus % a.nodes != 0 || l.tp > a.gpus / a.nodes))
    return reject(
        fmt::format("the job's {} GPUs over {} nodes cannot hold a TP group of {} inside a node; "
                    "request the same number of GPUs on every node",
                    a.gpus, a.nodes, l.tp));
  if (a.qos != d.tier->qos)
    return reject(
        fmt::format("the job runs under QOS '{}' but tier '{}' uses QOS '{}'; submit with "
                    "--qos={} or drop --qos",
                    printable(a.qos), d.tier->name, d.tier->qos, d.tier->qos));
  if (!a.account.empty() && a.account != d.team->account)
    return reject(
        fmt::format("the job is charged to account '{}' but team '{}' uses account '{}'; submit "
                    "with --account={}",
                    printable(a.account), d.team->name, d.team->account, d.team->account));
  if (const int limit = policy.topology.switches_for(l.world());
      limit > 0 && a.nodes > 1 && (a.req_switches == 0 || a.req_switches > limit))
    return reject(fmt::format(
        "a {}-GPU job must sit under at most {} switch(es) but the job's limit is {}; "
        "submit with --switches={}",
        l.world(), limit, a.req_switches == 0 ? std::string("none") : std::to_string(a.req_switches), limit));
  if (!a.partition.empty()) {
    std::string partition = a.partition;
    if (auto problem = pool_problem(policy, *d.tier, partition)) return reject(*problem);
  }
  if (a.time_limit_s > d.tier->max_wall_s)
    return reject(
        fmt::format("the job's time limit {} exceeds tier '{}''s max wall {}; submit with --time={}",
                    format_wall_time(a.time_limit_s), d.tier->name, format_wall_time(d.tier->max_wall_s),
                    format_wall_time(d.tier->max_wall_s)));
  if (auto gate = snapshot_gate(d, usage)) return *gate;
  const auto it = usage.snapshot->teams.find(d.team->name);
  const double used = it == usage.snapshot->teams.end() ? 0.0 : it->second.used_gpu_hours;
  if (used >= d.team->budget_gpu_hours)
    return reject(
        fmt::format("over quota: team '{}' has used {:.1f} of its {:.1f} GPU-hours this {}; the "
                    "job cannot start until the next period or a larger budget",
                    d.team->name, used, d.team->budget_gpu_hours, period_name(policy.period)));
  return d;
}

namespace {

// 960 -> "960", 2.5 -> "2.5".
std::string number_text(double v) {
  std::string s = fmt::format("{:.1f}", v);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s;
}

// The path as the kernel would walk it: each component in turn, a symlink replaced by its target (read
// with readlink, which needs only the link's own directory), '..' taken from what was reached so far. A
// link inside the team's root to a directory the caller cannot even enter is still seen to leave the root;
// a component that is missing or cannot be examined is taken as written.
std::filesystem::path resolved(const std::filesystem::path& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  std::vector<std::string> pending;  // components still to walk, the next one last
  const auto push = [&pending](const fs::path& path) {
    std::vector<std::string> parts;
    for (const auto& c : path.relative_path()) parts.push_back(c.string());
    pending.insert(pending.end(), parts.rbegin(), parts.rend());
  };
  push(ec ? p : abs);
  fs::path out = "/";
  for (int links = 0; !pending.empty();) {
    const std::string c = std::move(pending.back());
    pending.pop_back();
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      out = out.parent_path();
      continue;
    }
    const fs::path next = out / c;
    struct stat st {};
    if (::lstat(next.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && ++links <= 40) {
      const fs::path target = fs::read_symlink(next, ec);
      if (!ec) {
        if (target.is_absolute()) out = "/";
        push(target);
        continue;
      }
    }
    out = next;
  }
  return out;
}

}  // namespace

std::optional<std::string> approval_needed(const Policy& policy, const Tier& tier, int gpus,
                                           std::optional<int64_t> time_limit_s) {
  const ApprovalRules& rules = policy.approval;
  std::vector<std::string> reasons;
  if (rules.gpus > 0 && gpus > rules.gpus)
    reasons.push_back(
        fmt::format("{} GPUs is more than the {} a job may take without approval", gpus, rules.gpus));
  if (rules.gpu_hours > 0 && time_limit_s) {
    const double gpu_hours = gpus * (*time_limit_s / 3600.0);
    if (gpu_hours > rules.gpu_hours)
      reasons.push_back(fmt::format("an estimated {} GPU-hours ({} GPUs x {}) is more than {}",
                                    number_text(gpu_hours), gpus, format_hours(*time_limit_s),
                                    number_text(rules.gpu_hours)));
  }
  if (std::find(rules.tiers.begin(), rules.tiers.end(), tier.name) != rules.tiers.end())
    reasons.push_back(fmt::format("tier '{}' always needs approval", tier.name));
  if (reasons.empty()) return std::nullopt;
  return fmt::format("{}", fmt::join(reasons, "; "));
}

std::string approval_request_command(const Team& team, const Tier& tier, int gpus,
                                     std::optional<int64_t> time_limit_s) {
  return fmt::format("forge-quota request --team {} --tier {} --gpus {} --time {} --reason \"...\"",
                     team.name, tier.name, gpus, format_hours(time_limit_s.value_or(tier.max_wall_s)));
}

std::string approval_missing_message(const std::string& reason, const Team& team, const Tier& tier, int gpus,
                                     std::optional<int64_t> time_limit_s) {
  return fmt::format(
      "this job needs an approval: {}; ask for one with '{}' and submit again with --train-approval=ID (the "
      "id it prints)",
      reason, approval_request_command(team, tier, gpus, time_limit_s));
}

std::optional<std::string> run_dir_violation(const Policy& policy, const Team& team, const Identity& who,
                                             const std::string& run_dir) {
  if (team.root.empty() || policy.is_admin(who)) return std::nullopt;
  const std::filesystem::path root = resolved(team.root);
  if (!run_dir.empty() && path_within(resolved(run_dir).string(), root.string())) return std::nullopt;
  return fmt::format("run.dir '{}' is outside team {}'s directory {}; put the run under {}/runs",
                     printable(run_dir, 200), team.name, team.root, team.root);
}

}  // namespace forge::quota
