// `forge-quota sync`: sacct + squeue + run summaries -> ledger -> usage snapshot.
#pragma once

#include "forge/quota/policy.h"

#include <cstdint>
#include <string>
#include <vector>

namespace forge::quota {

struct SyncOptions {
  int64_t from = 0, to = 0;  // the sacct window (UTC seconds)
  std::string ledger_path, snapshot_path;
  std::vector<std::string> runs_dirs;
};

struct SyncResult {
  size_t runs = 0, queued = 0, summaries = 0;
  size_t approval_jobs = 0;  // approval uses that learnt their job id
  std::vector<std::string> warnings;
};

std::vector<std::string> sacct_args(int64_t from, int64_t to);
std::vector<std::string> squeue_args();

// Reads sacct (runs, job comments, admin comments) and squeue, records them in the ledger, sets the job
// ids of approval uses (ApprovalStore::record_job_ids) and writes the snapshot.
SyncResult sync_usage(const Policy& policy, const SyncOptions& options, int64_t now);

}  // namespace forge::quota
