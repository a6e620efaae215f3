#include "forge/quota/sync.h"

#include "forge/quota/accounting.h"
#include "forge/quota/approvals.h"
#include "forge/quota/ledger.h"
#include "forge/quota/slurm_cli.h"
#include "forge/quota/snapshot.h"
#include "forge/quota/usage.h"

namespace forge::quota {

std::vector<std::string> sacct_args(int64_t from, int64_t to) {
  return {"sacct",          "-a", "-X",           "-D", "--parsable2", "--noheader", "-S",
          format_utc(from), "-E", format_utc(to), "-o", kSacctFields};
}

std::vector<std::string> squeue_args() {
  return {"squeue", "--noheader", "-a", "-t", "PENDING,RUNNING,SUSPENDED,CONFIGURING,COMPLETING",
          "-O",     kSqueueFields};
}

SyncResult sync_usage(const Policy& policy, const SyncOptions& o, int64_t now) {
  // Both commands read before the ledger is touched: a failure leaves the ledger as it was.
  const std::vector<RunRecord> runs = parse_sacct(run_checked(sacct_args(o.from, o.to), {"TZ=UTC"}));
  const std::vector<QueuedJob> queue = parse_squeue(run_checked(squeue_args(), {"TZ=UTC"}));
  SyncResult result;
  auto summaries = scan_summaries(o.runs_dirs, &result.warnings);
  // Jobs whose run directories are out of reach still left their summary in the job's comment.
  std::vector<std::string> comments = sacct_args(o.from, o.to);
  comments.back() = "JobID,Comment";
  for (auto& [job, s] : parse_job_comments(run_checked(comments, {"TZ=UTC"}))) summaries.try_emplace(job, s);
  // The controller appends " forge-approval=ID" to the AdminComment of a job it admitted with an approval.
  std::vector<std::string> admin_comments = sacct_args(o.from, o.to);
  admin_comments.back() = "JobID,AdminComment";
  const std::string approval_jobs = run_checked(admin_comments, {"TZ=UTC"});
  Ledger ledger(o.ledger_path);
  ledger.record(runs, queue, summaries, now);
  result.approval_jobs = ApprovalStore(o.ledger_path).record_job_ids(approval_jobs);
  result.runs = runs.size();
  result.queued = queue.size();
  result.summaries = summaries.size();

  const auto [start, end] = period_bounds(policy.period, now);
  const auto status = compute_status(policy, ledger.runs(start, end), ledger.queue(), start, end);
  write_snapshot(o.snapshot_path, make_snapshot(policy, status, now));
  return result;
}

}  // namespace forge::quota
