// The running job in Prometheus, through node_exporter's textfile collector: when the cluster sets
// FORGE_PROMETHEUS_DIR (the collector's --collector.textfile.directory), the first rank of each node keeps
// forge_job_<job>_<node>.prom there up to date — tokens/s, MFU, step, loss, age of the newest checkpoint,
// ETTR so far — labelled with job id, team, tier, layout and node, and removes it when the process ends.
// Best effort: a directory that cannot be written costs one warning, never the run.
#pragma once

#include "forge/comm/groups.h"
#include "forge/common/json.h"
#include "forge/common/prometheus.h"

#include <chrono>
#include <string>

namespace forge::launcher {

struct JobProgress {
  double checkpoint_age_s = 0;  // since the newest checkpoint this process committed (else its start)
  double ettr = 0;              // step time kept by a committed checkpoint / process time so far
};

class JobGauges {
 public:
  explicit JobGauges(const comm::ProcessGroups& groups);
  ~JobGauges();
  JobGauges(const JobGauges&) = delete;
  JobGauges& operator=(const JobGauges&) = delete;

  // After a step: rewrites the file at most every few seconds (a scrape is every 15 s or more).
  void update(const Json& record, const JobProgress& progress);

 private:
  std::string path_;  // empty: off
  PromLabels labels_;
  std::chrono::steady_clock::time_point last_write_{};
};

}  // namespace forge::launcher
