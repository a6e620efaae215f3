#include "forge/quota/report.h"

#include "forge/common/json.h"
#include "forge/quota/accounting.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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
  double productive_hours = 0, ettr_hours = 0;  // over runs whose processes recorded segments
};

// What a run (one sacct row: one allocation of a job) lost and kept, as fractions of its GPU-hours. With
// forge-train's segments of that allocation: the work after the newest committed checkpoint of a process
// that did not finish, plus the start-up of a process that resumed (restart cost); kept = step time that
// a checkpoint or the finished run holds. Without them, sacct's state alone: all of a failed, preempted
// or requeued run is lost, and the run adds nothing to ETTR.
struct RunShare {
  double wasted = 0;
  std::optional<double> productive;
};

RunShare share_of(const RunRecord& r, const std::map<std::string, RunSummary>& summaries) {
  const auto it = summaries.find(r.job_id);
  const int64_t end = r.end > 0 ? r.end : r.start + r.elapsed_s;
  double lost_s = 0, kept_s = 0;
  bool found = false;
  if (it != summaries.end())
    for (const RunSegment& g : it->second.segments) {
      // The process starts a moment after the allocation and ends before sacct's End.
      if (g.job_id != r.job_id || g.start < double(r.start) - 1 || g.start > double(end) + 1) continue;
      found = true;
      lost_s += g.wasted_s();
      kept_s += g.kept_train_s;
    }
  if (!found || r.elapsed_s <= 0) return {is_wasted_state(r.state) ? 1.0 : 0.0, std::nullopt};
  const double elapsed = double(r.elapsed_s);
  return {std::min(1.0, lost_s / elapsed), std::min(1.0, kept_s / elapsed)};
}

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
  if (a.ettr_hours > 0) a.row.ettr = a.productive_hours / a.ettr_hours;
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
    const RunShare share = share_of(r, summaries);
    for (Acc* a : {&groups[group_key(policy, r, by)], &total}) {
      a->row.gpu_hours += h;
      a->row.cost += cost;
      a->row.wasted_gpu_hours += h * share.wasted;
      if (share.productive) {
        a->productive_hours += h * *share.productive;
        a->ettr_hours += h;
      }
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
  // What costs most is what a report is read for. Keys that are numbers (job ids) compare as numbers.
  const auto key_less = [](const std::string& a, const std::string& b) {
    const auto numeric = [](const std::string& s) {
      return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (numeric(a) && numeric(b) && a.size() != b.size()) return a.size() < b.size();
    return a < b;
  };
  std::stable_sort(rep.rows.begin(), rep.rows.end(), [&](const ReportRow& a, const ReportRow& b) {
    if (a.cost != b.cost) return a.cost > b.cost;
    if (a.gpu_hours != b.gpu_hours) return a.gpu_hours > b.gpu_hours;
    return key_less(a.key, b.key);
  });
  return rep;
}

void keep_costliest(Report& r, size_t top) {
  if (r.rows.size() <= top + 1) return;  // folding one row into "other (1)" would hide it for nothing
  ReportRow other;
  other.key = fmt::format("other ({})", r.rows.size() - top);
  double mfu_hours = 0, mfu_sum = 0, token_cost = 0;
  for (size_t i = top; i < r.rows.size(); ++i) {
    const ReportRow& x = r.rows[i];
    other.gpu_hours += x.gpu_hours;
    other.cost += x.cost;
    other.jobs += x.jobs;  // rows by job, user or team share no job (a job has one account and user)
    other.wasted_gpu_hours += x.wasted_gpu_hours;
    other.tokens += x.tokens;
    if (x.cost_per_mtoken && x.tokens > 0) token_cost += *x.cost_per_mtoken * x.tokens / 1e6;
    if (x.mfu) mfu_sum += *x.mfu * x.gpu_hours, mfu_hours += x.gpu_hours;
  }
  if (other.tokens > 0 && token_cost > 0) other.cost_per_mtoken = token_cost / other.tokens * 1e6;
  if (mfu_hours > 0) other.mfu = mfu_sum / mfu_hours;
  r.rows.resize(top);
  r.rows.push_back(other);
}

std::string format_amount(double v) {
  if (v == 0 || !std::isfinite(v)) return fmt::format("{:.2f}", v);
  const int decimals = std::clamp(2 - static_cast<int>(std::floor(std::log10(std::fabs(v)))), 0, 6);
  return fmt::format("{:.{}f}", v, decimals);
}

std::string render_report_table(const Report& r) {
  const std::string rule(111, '-');
  std::string out = rule + "\n";
  out +=
      fmt::format("GPU usage by {} {} - {} (UTC)\n", group_name(r.by), format_utc(r.from), format_utc(r.to));
  out += rule + "\n";
  const auto line = [](const ReportRow& x) {
    return fmt::format("{:<20} {:>12} {:>12} {:>6} {:>12} {:>14.0f} {:>12} {:>6} {:>6}\n", x.key,
                       format_amount(x.gpu_hours), format_amount(x.cost), x.jobs,
                       format_amount(x.wasted_gpu_hours), x.tokens, opt(x.cost_per_mtoken, 4), opt(x.mfu, 3),
                       opt(x.ettr, 3));
  };
  out += fmt::format("{:<20} {:>12} {:>12} {:>6} {:>12} {:>14} {:>12} {:>6} {:>6}\n", group_name(r.by),
                     "gpu_hours", "cost", "jobs", "wasted_gpu_h", "tokens", "cost/Mtoken", "mfu", "ettr");
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
  std::string out = fmt::format("{},gpu_hours,cost,jobs,wasted_gpu_hours,tokens,cost_per_mtoken,mfu,ettr\n",
                                group_name(r.by));
  for (const auto& x : r.rows)
    out +=
        fmt::format("{},{:.6f},{:.6f},{},{:.6f},{:.0f},{},{},{}\n", quote(x.key), x.gpu_hours, x.cost, x.jobs,
                    x.wasted_gpu_hours, x.tokens, opt(x.cost_per_mtoken, 6), opt(x.mfu, 6), opt(x.ettr, 6));
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
                    {"mfu", nullable(x.mfu)},
                    {"ettr", nullable(x.ettr)}});
  return rows.dump(2) + "\n";
}

}  // namespace forge::quota
