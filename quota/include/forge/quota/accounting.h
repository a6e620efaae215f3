// Budgets against usage: what each team has used and reserved this period, per tier, in charged
// GPU-hours (GPU-hours x the tier's charge, the same arithmetic Slurm applies with the QOS UsageFactor).
#pragma once

#include "forge/quota/policy.h"
#include "forge/quota/snapshot.h"
#include "forge/quota/usage.h"

#include <map>
#include <string>
#include <vector>

namespace forge::quota {

struct TierUsage {
  double used_gpu_hours = 0;
  double reserved_gpu_hours = 0;
};

struct TeamStatus {
  std::string team;
  double budget_gpu_hours = 0;
  double used_gpu_hours = 0;
  double reserved_gpu_hours = 0;
  double remaining_gpu_hours = 0;  // budget - used - reserved (may be negative)
  int running_gpus = 0;
  std::map<std::string, TierUsage> tiers;
};

// The charge of the tier behind a QOS (1 for a QOS no tier uses).
double charge_for_qos(const Policy& policy, const std::string& qos);

// GPU-hours a queued job may still use: its GPUs for the rest of its time limit (pending: all of it;
// UNLIMITED: the tier's max wall).
double reserved_gpu_hours(const Policy& policy, const QueuedJob& job);

// One row per team of the policy, in name order. `runs` are the runs overlapping the period.
std::vector<TeamStatus> compute_status(const Policy& policy, const std::vector<RunRecord>& runs,
                                       const std::vector<QueuedJob>& queue, int64_t period_start,
                                       int64_t period_end);

UsageSnapshot make_snapshot(const Policy& policy, const std::vector<TeamStatus>& status, int64_t now);

std::string render_status_table(const std::vector<TeamStatus>& status, const Policy& policy);
std::string render_status_json(const std::vector<TeamStatus>& status);
// Prometheus gauges per team (budget, used, reserved, remaining GPU-seconds; running GPUs) and the ledger's
// last sync time, labelled with the policy's cluster.
std::string render_status_prom(const std::vector<TeamStatus>& status, const Policy& policy,
                               int64_t last_sync);

}  // namespace forge::quota
