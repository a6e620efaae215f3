// forge-train report RUN_DIR: a self-contained HTML page (no scripts, no network) and a text summary, from
// metrics/rank-*.jsonl, summary.json and the checkpoint tree. Inline SVG charts against the step, with
// resumes, checkpoint saves and guard events marked: loss, tokens/s, MFU, the step-time split stacked
// (compute, communication, bubble, data wait, checkpoint stall), peak memory; the straggler view (each
// rank's mean split as one stacked bar, flagged ranks outlined); tables of the run's segments (job,
// layout, steps, lost time) and checkpoint saves.
#pragma once

#include "forge/common/json.h"

#include <cstdint>
#include <string>
#include <vector>

namespace forge::launcher {

struct RunReport {
  std::string run_dir, html_path;
  Json summary;  // summary.json, null when the run has not written one (running, or killed)
  int64_t records = 0, resumes = 0, guard_events = 0, ckpt_saves = 0;
  int64_t first_step = 0, last_step = 0;
  // Over the run's segments (summary.json): step time kept by a committed checkpoint or the finished run
  // over the processes' wall time, and the time lost (after the last committed checkpoint, and restarts:
  // the cost report's waste, docs/ADMISSION.md). -1: no segments recorded.
  double ettr = -1, lost_s = 0;
  std::vector<std::string> checkpoints;  // "milestone step 50: loss 2.3456, 1.2 MiB"
};

// Reads the run directory and writes RUN_DIR/report.html. A path that is not a run directory (no
// metrics/rank-*.jsonl) is a usage error (64); a malformed metrics line or summary.json is a data
// error (65) naming file and line; an unwritable report is 74.
RunReport write_report(const std::string& run_dir);

// The text summary on stdout: steps, tokens, wall time, final loss, mean MFU, ETTR, exit class, checkpoints.
void print_report(const RunReport& report);

}  // namespace forge::launcher
