#include "forge/quota/report.h"

#include "forge/common/json.h"
#include "forge/quota/accounting.h"

#include <fmt/format.h>

#include <set>

namespace forge::quota {
namespace {

std::string group_key(const Policy& policy, const RunRecord& r, GroupBy by) {
  switch (by) {
    case GroupBy::kTeam: {
      const Team* t = policy.team_by_account(r.account);
      return t ? t->name : r.account;
    }
    case GroupBy::kTier: {
      const Tier* t = policy.tier_by_qos(r.qos);
      return t ? t->name : r.qos;
    }
    case GroupBy::kUser:
      return r.user;
    case GroupBy::kJob:
      return r.job_id;
  }
  return r.account;
}

struct Acc {
  ReportRow row;
  std::set<std::string> jobs;
  std::map<std::string, double> job_hours, job_cost;
};

void finish(const std::map<std::string, RunSummary>& summaries, Acc& a) {
  a.row.jobs = static_cast<int64_t>(a.jobs.size());
  double costed = 0, mfu_sum = 0, mfu_hours = 0;
  for (const auto& job : a.jobs) {
    const auto it = summaries.find(job);
    if (it == summaries.end()) continue;
    if (it->second.tokens > 0) {
      a.row.tokens += it->second.tokens;
      costed += a.job_cost[job];
    }
    if (it->second.mfu) {
      mfu_sum += *it->second.mfu * a.job_hours[job];
      mfu_hours += a.job_hours[job];
    }
  }
  if (a.row.tokens > 0) a.row.cost_per_mtoken = costed / a.row.tokens * 1e6;
  if (mfu_hours > 0) a.row.mfu = mfu_sum / mfu_hours;
}

std::string opt(const std::optional<double>& v, int digits) {
  return v ? fmt::format("{:.{}f}", *v, digits) : "";
}

}  // namespace

const char* group_name(GroupBy by) {
  switch (by) {
    case GroupBy::kTeam:
      return "team";
    case GroupBy::kTier:
      return "tier";
    case GroupBy::kUser:
      return "user";
    case GroupBy::kJob:
      return "job";
  }
  return "team";
}

Report build_report(const Policy& policy, const std::vector<RunRecord>& runs,
                    const std::map<std::string, RunSummary>& summaries, GroupBy by, int64_t from,
                    int64_t to) {
  std::map<std::string, Acc> groups;
  Acc total;
  for (const auto& r : runs) {
    const double h = gpu_hours_in(r, from, to);
    if (h <= 0 && !(r.start >= from && r.start < to)) continue;
    const double cost =
        h * policy.prices.per_gpu_hour(r.partition, r.gpu_type) * charge_for_qos(policy, r.qos);
    for (Acc* a : {&groups[group_key(policy, r, by)], &total}) {
      a->row.gpu_hours += h;
      a->row.cost += cost;
      if (is_wasted_state(r.state)) a->row.wasted_gpu_hours += h;
      a->jobs.insert(r.job_id);
      a->job_hours[r.job_id] += h;
      a->job_cost[r.job_id] += cost;
    }
  }
  Report rep;
  rep.by = by;
  rep.from = from;
  rep.to = to;
  for (auto& [key, a] : groups) {
    a.row.key = key;
    finish(summaries, a);
    rep.rows.push_back(a.row);
  }
  total.row.key = "TOTAL";
  finish(summaries, total);
  rep.total = total.row;
  return rep;
}

std::string render_report_table(const Report& r) {
  const std::string rule(104, '-');
  std::string out = rule + "\n";
  out +=
      fmt::format("GPU usage by {} {} - {} (UTC)\n", group_name(r.by), format_utc(r.from), format_utc(r.to));
  out += rule + "\n";
  const auto line = [](const ReportRow& x) {
    return fmt::format("{:<20} {:>12.2f} {:>12.2f} {:>6} {:>12.2f} {:>14.0f} {:>12} {:>6}\n", x.key,
                       x.gpu_hours, x.cost, x.jobs, x.wasted_gpu_hours, x.tokens, opt(x.cost_per_mtoken, 4),
                       opt(x.mfu, 3));
  };
  out += fmt::format("{:<20} {:>12} {:>12} {:>6} {:>12} {:>14} {:>12} {:>6}\n", group_name(r.by), "gpu_hours",
                     "cost", "jobs", "wasted_gpu_h", "tokens", "cost/Mtoken", "mfu");
  for (const auto& row : r.rows) out += line(row);
  out += line(r.total);
  return out;
}

std::string render_report_csv(const Report& r) {
  const auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  std::string out =
      fmt::format("{},gpu_hours,cost,jobs,wasted_gpu_hours,tokens,cost_per_mtoken,mfu\n", group_name(r.by));
  for (const auto& x : r.rows)
    out += fmt::format("{},{:.6f},{:.6f},{},{:.6f},{:.0f},{},{}\n", quote(x.key), x.gpu_hours, x.cost, x.jobs,
                       x.wasted_gpu_hours, x.tokens, opt(x.cost_per_mtoken, 6), opt(x.mfu, 6));
  return out;
}

std::string render_report_json(const Report& r) {
  Json rows = Json::array();
  const auto nullable = [](const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); };
  for (const auto& x : r.rows)
    rows.push_back({{group_name(r.by), x.key},
                    {"gpu_hours", x.gpu_hours},
                    {"cost", x.cost},
                    {"jobs", x.jobs},
                    {"wasted_gpu_hours", x.wasted_gpu_hours},
                    {"tokens", x.tokens},
                    {"cost_per_mtoken", nullable(x.cost_per_mtoken)},
                    {"mfu", nullable(x.mfu)}});
  return rows.dump(2) + "\n";
}

}  // namespace forge::quota
