// Cost and efficiency reports over a time window, grouped by team, tier, user or job, in sreport's
// spirit: GPU-hours clipped to the window, plain text by default, CSV/JSON/HTML on request.
#pragma once

#include "forge/quota/ledger.h"
#include "forge/quota/policy.h"
#include "forge/quota/usage.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace forge::quota {

enum class GroupBy { kTeam, kTier, kUser, kJob };

struct ReportRow {
  std::string key;
  double gpu_hours = 0;                   // raw GPU-hours inside the window
  double cost = 0;                        // gpu_hours x price x tier charge
  int64_t jobs = 0;                       // distinct job ids
  double wasted_gpu_hours = 0;            // lost work and restart cost (docs/ADMISSION.md, "Waste")
  double tokens = 0;                      // from the runs' summary.json
  std::optional<double> cost_per_mtoken;  // cost of jobs with a token count / their tokens x 1e6
  std::optional<double> mfu;              // mean MFU weighted by GPU-hours, over jobs that report one
  std::optional<double> ettr;             // effective training time ratio: kept step time / GPU-hours,
                                          // over runs whose processes recorded segments
};

struct Report {
  GroupBy by = GroupBy::kTeam;
  int64_t from = 0, to = 0;
  std::vector<ReportRow> rows;  // the costliest first (then by GPU-hours; ties by key, job ids as numbers)
  ReportRow total;
};

const char* group_name(GroupBy by);

Report build_report(const Policy& policy, const std::vector<RunRecord>& runs,
                    const std::map<std::string, RunSummary>& summaries, GroupBy by, int64_t from, int64_t to);

// Keeps the `top` costliest rows and sums the others into one row, "other (N)" (its jobs counted once).
void keep_costliest(Report& r, size_t top);

// GPU-hours (or a cost) with three significant digits: a 40-second job on one GPU is 0.0111, not 0.00.
std::string format_amount(double v);

std::string render_report_table(const Report& r);
std::string render_report_csv(const Report& r);
std::string render_report_json(const Report& r);
std::string render_report_html(const Report& r);

}  // namespace forge::quota
