#include "forge/quota/accounting.h"

#include "forge/common/json.h"
#include "forge/common/prometheus.h"

#include <fmt/format.h>

namespace forge::quota {

double charge_for_qos(const Policy& policy, const std::string& qos) {
  const Tier* t = policy.tier_by_qos(qos);
  return t ? t->charge : 1.0;
}

double reserved_gpu_hours(const Policy& policy, const QueuedJob& job) {
  int64_t limit = job.time_limit_s;
  if (limit == 0) {
    const Tier* t = policy.tier_by_qos(job.qos);
    limit = t ? t->max_wall_s : 0;
  }
  const int64_t left = std::max<int64_t>(0, limit - job.elapsed_s);
  return static_cast<double>(left) * job.gpus / 3600.0 * charge_for_qos(policy, job.qos);
}

std::vector<TeamStatus> compute_status(const Policy& policy, const std::vector<RunRecord>& runs,
                                       const std::vector<QueuedJob>& queue, int64_t period_start,
                                       int64_t period_end) {
  std::map<std::string, TeamStatus> by_team;
  for (const auto& [name, team] : policy.teams) {
    TeamStatus& s = by_team[name];
    s.team = name;
    s.budget_gpu_hours = team.budget_gpu_hours;
  }
  const auto tier_name = [&](const std::string& qos) {
    const Tier* t = policy.tier_by_qos(qos);
    return t ? t->name : qos;
  };
  for (const auto& r : runs) {
    const Team* team = policy.team_by_account(r.account);
    if (!team) continue;
    const double h = gpu_hours_in(r, period_start, period_end) * charge_for_qos(policy, r.qos);
    TeamStatus& s = by_team[team->name];
    s.used_gpu_hours += h;
    s.tiers[tier_name(r.qos)].used_gpu_hours += h;
  }
  for (const auto& j : queue) {
    const Team* team = policy.team_by_account(j.account);
    if (!team) continue;
    const double h = reserved_gpu_hours(policy, j);
    TeamStatus& s = by_team[team->name];
    s.reserved_gpu_hours += h;
    s.tiers[tier_name(j.qos)].reserved_gpu_hours += h;
    if (j.state == "RUNNING" || j.state == "COMPLETING" || j.state == "CONFIGURING") s.running_gpus += j.gpus;
  }
  std::vector<TeamStatus> out;
  for (auto& [_, s] : by_team) {
    s.remaining_gpu_hours = s.budget_gpu_hours - s.used_gpu_hours - s.reserved_gpu_hours;
    out.push_back(std::move(s));
  }
  return out;
}

UsageSnapshot make_snapshot(const Policy& policy, const std::vector<TeamStatus>& status, int64_t now) {
  UsageSnapshot snap;
  snap.generated_at = now;
  snap.period = policy.period;
  std::tie(snap.period_start, snap.period_end) = period_bounds(policy.period, now);
  for (const auto& s : status) snap.teams[s.team] = {s.used_gpu_hours, s.reserved_gpu_hours, s.running_gpus};
  return snap;
}

std::string render_status_table(const std::vector<TeamStatus>& status, const Policy& policy) {
  std::string out = fmt::format("{:<16} {:<10} {:>12} {:>12} {:>12} {:>12} {:>8}\n", "team", "tier", "budget",
                                "used", "reserved", "remaining", "run_gpus");
  for (const auto& s : status) {
    out += fmt::format("{:<16} {:<10} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>8}\n", s.team, "(all)",
                       s.budget_gpu_hours, s.used_gpu_hours, s.reserved_gpu_hours, s.remaining_gpu_hours,
                       s.running_gpus);
    for (const auto& [tier, u] : s.tiers)
      out += fmt::format("{:<16} {:<10} {:>12} {:>12.1f} {:>12.1f} {:>12} {:>8}\n", "", tier, "",
                         u.used_gpu_hours, u.reserved_gpu_hours, "", "");
  }
  out +=
      fmt::format("(charged GPU-hours this {}; budgets from {})\n", period_name(policy.period), policy.path);
  return out;
}

std::string render_status_prom(const std::vector<TeamStatus>& status, const Policy& policy,
                               int64_t last_sync) {
  // Prometheus wants base units: GPU-seconds (GPU-hours x 3600; Grafana divides back).
  PromGauges g;
  for (const auto& s : status) {
    const PromLabels labels{{"cluster", policy.cluster}, {"team", s.team}};
    g.set("forge_quota_budget_gpu_seconds", "GPU-time budget of the team this period.", labels,
          s.budget_gpu_hours * 3600);
    g.set("forge_quota_used_gpu_seconds", "Charged GPU-time the team used this period.", labels,
          s.used_gpu_hours * 3600);
    g.set("forge_quota_reserved_gpu_seconds", "GPU-time the team's running and pending jobs may still use.",
          labels, s.reserved_gpu_hours * 3600);
    g.set("forge_quota_remaining_gpu_seconds", "Budget minus used minus reserved (may be negative).", labels,
          s.remaining_gpu_hours * 3600);
    g.set("forge_quota_running_gpus", "GPUs the team's running jobs hold.", labels, s.running_gpus);
  }
  g.set("forge_quota_last_sync_timestamp_seconds", "Unix time of the ledger's last sync.",
        {{"cluster", policy.cluster}}, double(last_sync));
  return g.text();
}

std::string render_status_json(const std::vector<TeamStatus>& status) {
  Json rows = Json::array();
  for (const auto& s : status) {
    Json tiers = Json::object();
    for (const auto& [tier, u] : s.tiers)
      tiers[tier] = {{"used_gpu_hours", u.used_gpu_hours}, {"reserved_gpu_hours", u.reserved_gpu_hours}};
    rows.push_back({{"team", s.team},
                    {"budget_gpu_hours", s.budget_gpu_hours},
                    {"used_gpu_hours", s.used_gpu_hours},
                    {"reserved_gpu_hours", s.reserved_gpu_hours},
                    {"remaining_gpu_hours", s.remaining_gpu_hours},
                    {"running_gpus", s.running_gpus},
                    {"tiers", tiers}});
  }
  return rows.dump(2) + "\n";
}

}  // namespace forge::quota
